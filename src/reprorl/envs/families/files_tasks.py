"""The files family's task kinds: questions about a config tree and edits to make in it.

Each kind states what must hold at the end: every file's final text, and which files are compared
by parsed content (edited files: the value matters, not the formatting) rather than byte for byte.
Its oracle's calls read everything the oracle then says or writes: a service_name it answers and
every file it rewrites come from a `cat` of that file earlier in the episode, so a demonstration
never shows an answer the episode could not have read (a policy warm-started on one that did would
learn to guess).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from reprorl.envs.families.files_tree import LEVELS, Service, Tree

Call = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class Draft:
    """A task before it becomes a `Task`: its text, its oracle's calls, and what must hold at the end."""

    kind: str
    text: str
    difficulty: int
    calls: tuple[Call, ...]
    answer: int | str | None = None
    distractors: tuple[str, ...] = ()
    final: dict[str, str] | None = None
    """Every file's expected text at the end (change tasks)."""
    edited: tuple[str, ...] = ()
    """Files compared by parsed content rather than bytes."""
    targets: tuple[str, ...] = ()
    """Files the task is about (the verifier's `target` component)."""


def _grep(pattern: str) -> Call:
    return ("grep", {"pattern": pattern, "path": "services"})


def _cat(service: Service) -> Call:
    return ("cat", {"path": service.path})


def _others(tree: Tree, name: str) -> tuple[str, ...]:
    return (*(s.name for s in tree.services if s.name != name), "example")


def _edit(tree: Tree, services: Sequence[Service]) -> tuple[dict[str, str], tuple[Call, ...]]:
    files = dict(tree.files)
    calls: list[Call] = []
    for service in services:
        files[service.path] = service.text()
        calls.append(("write_file", {"path": service.path, "content": service.text()}))
    return files, tuple(calls)


# -- questions -------------------------------------------------------------------------------------


def port_owner(rng: random.Random, tree: Tree) -> Draft | None:
    decoys = tree.decoy_ports()
    s = rng.choice([s for s in tree.services if s.port in decoys] or list(tree.services))
    text = f"Which service listens on port {s.port}? Answer with its service_name."
    calls = (_grep(str(s.port)), _cat(s))
    return Draft("port_owner", text, 1, calls, answer=s.name, distractors=_others(tree, s.name))


def value_of(rng: random.Random, tree: Tree) -> Draft | None:
    s = rng.choice(tree.services)
    key = rng.choice(("timeout", "workers"))
    text = f"What {key} value is the {s.name} service configured with? Answer with the number."
    calls = (_grep(s.name), _cat(s))
    return Draft("value_of", text, 1, calls, answer=getattr(s, key))


def count_over(rng: random.Random, tree: Tree) -> Draft | None:
    key, unit = rng.choice((("workers", "workers"), ("timeout", "seconds of timeout")))
    threshold = rng.randint(2, 12) if key == "workers" else rng.choice((10, 15, 20, 30, 45, 60))
    count = sum(1 for s in tree.services if getattr(s, key) > threshold)
    if not 0 < count < len(tree.services):
        return None
    text = f"How many live services are configured with more than {threshold} {unit}? Answer with the number."
    return Draft("count_over", text, 2, (_grep(key),), answer=count)


def extreme(rng: random.Random, tree: Tree) -> Draft | None:
    group = rng.choice(sorted({s.path.split("/")[1] for s in tree.services}))
    key, most = rng.choice((("timeout", True), ("timeout", False), ("workers", True), ("workers", False)))
    members = sorted(
        (s for s in tree.services if s.path.split("/")[1] == group), key=lambda s: getattr(s, key)
    )
    if len(members) < 2:
        return None
    ranked = members[::-1] if most else members
    if getattr(ranked[0], key) == getattr(ranked[1], key):
        return None
    s = ranked[0]
    what = {("timeout", True): "the longest timeout", ("timeout", False): "the shortest timeout"}.get(
        (key, most), "the most workers" if most else "the fewest workers"
    )
    text = f"Of the live services under services/{group}/, which has {what}? Answer with its service_name."
    calls = (("grep", {"pattern": key, "path": f"services/{group}"}), _cat(s))
    return Draft("extreme", text, 2, calls, answer=s.name, distractors=_others(tree, s.name))


# -- changes ---------------------------------------------------------------------------------------


def set_value(rng: random.Random, tree: Tree) -> Draft | None:
    s = rng.choice(tree.services)
    key = rng.choice(("timeout", "workers", "port", "level"))
    value: int | str
    if key == "port":
        used = {t.port for t in tree.services} | tree.decoy_ports()
        value = rng.choice([p for p in range(8100, 8200) if p not in used])
        changed = replace(s, port=value)
    elif key == "level":
        value = rng.choice([lvl for lvl in LEVELS if lvl != s.level])
        changed = replace(s, level=value)
    else:
        value = rng.choice([v for v in (3, 4, 6, 8, 12, 25, 40, 75, 100) if v != getattr(s, key)])
        changed = replace(s, timeout=value) if key == "timeout" else replace(s, workers=value)
    files, writes = _edit(tree, [changed])
    text = f"In the live config that defines service_name = {s.name}, set {key} to {value}."
    return Draft(
        "set_value",
        text,
        2,
        (_grep(s.name), _cat(s), *writes),
        final=files,
        edited=(s.path,),
        targets=(s.path,),
    )


def move_config(rng: random.Random, tree: Tree) -> Draft | None:
    s = rng.choice(tree.services)
    destination = "archive/" + s.path.rsplit("/", 1)[-1]
    files = {p: t for p, t in tree.files.items() if p != s.path}
    files[destination] = tree.files[s.path]
    text = (
        f"Move the live config that sets port = {s.port} into the directory archive/, keeping its file name."
    )
    calls = (_grep(str(s.port)), ("move", {"src": s.path, "dst": "archive/"}))
    return Draft("move_config", text, 2, calls, final=dict(sorted(files.items())), targets=(destination,))


def relevel(rng: random.Random, tree: Tree) -> Draft | None:
    old, new = rng.sample(LEVELS, 2)
    matching = [s for s in tree.services if s.level == old]
    # Two files: grep, then read and rewrite each, then answer is six turns (learning.max_turns in
    # the shipped recipes); a third would not fit.
    if len(matching) != 2:
        return None
    files, writes = _edit(tree, [replace(s, level=new) for s in matching])
    reads = [call for s, write in zip(matching, writes, strict=True) for call in (_cat(s), write)]
    paths = tuple(s.path for s in matching)
    text = (
        f"Every live service that logs at level {old} should log at level {new} instead. Change all of them."
    )
    return Draft("relevel", text, 3, (_grep(old), *reads), final=files, edited=paths, targets=paths)


def copy_timeout(rng: random.Random, tree: Tree) -> Draft | None:
    a, b = rng.sample(tree.services, 2)
    if a.timeout == b.timeout:
        return None
    files, writes = _edit(tree, [replace(a, timeout=b.timeout)])
    text = f"Make the service that listens on port {a.port} use the same timeout as the {b.name} service."
    calls = (_grep(str(a.port)), _cat(a), _grep(b.name), _cat(b), *writes)
    return Draft("copy_timeout", text, 3, calls, final=files, edited=(a.path,), targets=(a.path,))


KINDS: tuple[Callable[[random.Random, Tree], Draft | None], ...] = (
    port_owner,
    value_of,
    count_over,
    extreme,
    set_value,
    move_config,
    relevel,
    copy_timeout,
)
