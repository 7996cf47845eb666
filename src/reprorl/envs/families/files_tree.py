"""Service config trees of the files family: the three config formats and a seeded tree with decoys.

Each live service has one config (`config.ini`, `config.toml` or `config.json`) somewhere under
`services/`, often in a directory whose name is not the service's name. Decoys make searching
honest work: backups (`*.bak`) holding stale values, a template, a defaults file, and a ports page
in `docs/` that is out of date.
"""

from __future__ import annotations

import configparser
import json
import random
import tomllib
from dataclasses import dataclass, replace
from typing import Any

FORMATS = ("ini", "toml", "json")
LEVELS = ("debug", "info", "warning", "error")
LIVE_NAMES = ("config.ini", "config.toml", "config.json")

_SERVICES = (
    "billing", "search", "auth", "checkout", "inventory", "notifications", "reports", "gateway",
    "ledger", "media", "scheduler", "profiles", "shipping", "analytics", "pricing", "recommendations",
)  # fmt: skip
_GROUPS = ("core", "payments", "edge", "data", "internal")
_CODENAMES = (
    "atlas",
    "borealis",
    "cobalt",
    "delta",
    "ember",
    "falcon",
    "granite",
    "harbor",
    "ion",
    "juniper",
)
_TIMEOUTS = (5, 10, 15, 20, 30, 45, 60, 90, 120)
_HOSTS = ("0.0.0.0", "127.0.0.1", "10.0.0.12", "10.0.4.7")

Data = dict[str, dict[str, Any]]
"""A config as nested sections: {"service": {...}, "limits": {...}, "logging": {...}}."""


@dataclass(frozen=True)
class Service:
    """One live service and where its config lives."""

    name: str
    path: str
    fmt: str
    host: str
    port: int
    timeout: int
    workers: int
    level: str

    def data(self) -> Data:
        return {
            "service": {"service_name": self.name, "host": self.host, "port": self.port},
            "limits": {"timeout": self.timeout, "workers": self.workers},
            "logging": {"level": self.level},
        }

    def text(self) -> str:
        return render(self.fmt, self.data())


def render(fmt: str, data: Data) -> str:
    """A config's text in the given format."""
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    blocks = []
    for section, values in data.items():
        lines = [f"[{section}]"]
        for key, value in values.items():
            shown = json.dumps(value) if fmt == "toml" and isinstance(value, str) else str(value)
            lines.append(f"{key} = {shown}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def parse(fmt: str, text: str) -> Data:
    """A config's content as the verifier compares it (INI values stay strings, as INI has no types)."""
    if fmt == "json":
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("a JSON config must be an object")
        return value
    if fmt == "toml":
        return tomllib.loads(text)
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(text)
    return {section: dict(parser[section]) for section in parser.sections()}


def format_of(path: str) -> str:
    """The config format a path's name implies (a backup keeps its original's format)."""
    name = path.removesuffix(".bak")
    return name.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Tree:
    """The live services and every file of the tree, by path."""

    services: tuple[Service, ...]
    files: dict[str, str]

    def service(self, name: str) -> Service:
        return next(s for s in self.services if s.name == name)

    def decoy_ports(self) -> set[int]:
        """Ports that appear in files other than live configs (backups, docs, template)."""
        live = {s.path for s in self.services}
        return {port for path, text in self.files.items() if path not in live for port in _ports_in(text)}


def _ports_in(text: str) -> set[int]:
    return {int(w) for w in text.replace('"', " ").replace(",", " ").split() if w.isdigit() and len(w) == 4}


def generate_tree(rng: random.Random) -> Tree:
    """A tree of 8-10 live service configs plus backups, a template, defaults and stale docs."""
    count = rng.randint(8, 10)
    names = rng.sample(_SERVICES, count)
    ports = rng.sample([*range(8000, 8100), 8443, *range(9000, 9020)], count)
    codenames = iter(rng.sample(_CODENAMES, len(_CODENAMES)))
    services: list[Service] = []
    for name, port in zip(names, ports, strict=True):
        directory = name if rng.random() < 0.5 else next(codenames, f"svc-{port}")
        fmt = rng.choice(FORMATS)
        services.append(
            Service(
                name=name,
                path=f"services/{rng.choice(_GROUPS)}/{directory}/config.{fmt}",
                fmt=fmt,
                host=rng.choice(_HOSTS),
                port=port,
                timeout=rng.choice(_TIMEOUTS),
                workers=rng.randint(1, 16),
                level=rng.choices(LEVELS, (3, 6, 2, 1))[0],
            )
        )
    files = {s.path: s.text() for s in services}
    for live in rng.sample(services, rng.randint(2, 3)):
        # A backup holds an older config: often the port of another service, always a different timeout.
        other = rng.choice([s for s in services if s is not live])
        old = replace(
            live,
            port=other.port if rng.random() < 0.6 else live.port + 1,
            timeout=rng.choice([t for t in _TIMEOUTS if t != live.timeout]),
            level=rng.choice(LEVELS),
        )
        files[live.path + ".bak"] = old.text()
    template = Service("example", "", "ini", "0.0.0.0", rng.choice(ports), 30, 2, "info")
    files["templates/service.example.ini"] = "; copy this file to create a new service\n" + template.text()
    files["shared/defaults.toml"] = render(
        "toml", {"limits": {"timeout": 30, "workers": 2}, "logging": {"level": "info"}}
    )
    files["docs/ports.md"] = _ports_page(rng, services)
    return Tree(services=tuple(services), files=dict(sorted(files.items())))


def _ports_page(rng: random.Random, services: list[Service]) -> str:
    """A ports table that was last updated a while ago: one or two rows are wrong."""
    stale = {s.name for s in rng.sample(services, rng.randint(1, 2))}
    taken = {s.port for s in services}
    rows = []
    for s in sorted(services, key=lambda s: s.name):
        port = s.port
        if s.name in stale:
            port = rng.choice([p for p in range(8000, 8100) if p not in taken])
        rows.append(f"| {s.name} | {port} |")
    return (
        "# Service ports\n\nLast reviewed: 2023-03-14\n\n| service | port |\n|---|---|\n"
        + "\n".join(rows)
        + "\n"
    )
