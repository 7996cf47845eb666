"""An OpenEnv server as a run uses it: started on 127.0.0.1 (or reached at a URL), identified, restarted.

reprorl starts the server's command itself, on a free port of 127.0.0.1, the first time an episode
needs it, and waits for `/health`; a server that died is started again by the next episode that
needs it (the episode that saw it die is the platform's failure, retried). A server given by URL is
used as it is. The server's identity — its package and version, and what it says of itself at
`/schema` and `/metadata` — is hashed into the env's version, so a changed server is a changed env.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import httpx

from reprorl.envs.outside import installed_version
from reprorl.errors import UserInputError
from reprorl.hashing import content_hash
from reprorl.local_server import LocalServer, ServerStartError


class ExternalEnvError(Exception):
    """The external env's server could not be reached or failed: the platform's failure, not the agent's."""


@dataclass(frozen=True)
class OpenEnvServerSpec:
    """Where an OpenEnv server comes from: a command reprorl runs, or a URL it is already served at."""

    command: tuple[str, ...] = ()  # argv; "{port}" stands for the port reprorl picks on 127.0.0.1
    url: str | None = None
    package: str | None = None  # the Python package that ships the env, whose version is recorded
    name: str = ""  # the env's own name, for messages
    startup_timeout_s: float = 60.0
    call_timeout_s: float = 30.0  # each reset, step and state call
    connect_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise UserInputError("an OpenEnv server needs exactly one of command (to start it) or url")
        if self.command and not any("{port}" in part for part in self.command):
            raise UserInputError(
                f"OpenEnv server command {list(self.command)} has no '{{port}}': reprorl picks the port"
            )


@dataclass
class OpenEnvServer:
    """One server process (or URL) shared by a run's episodes, each its own WebSocket session."""

    spec: OpenEnvServerSpec
    _child: LocalServer | None = field(default=None, repr=False)
    _identity: dict[str, Any] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def starts(self) -> int:
        return self._child.starts if self._child is not None else 0

    def base_url(self) -> str:
        """The server's URL, starting (or restarting) it when it is not running."""
        if self.spec.url is not None:
            return self.spec.url.rstrip("/")
        with self._lock:
            if self._child is None:
                self._child = LocalServer(
                    f"OpenEnv server {self.spec.name!r}",
                    self.spec.command,
                    startup_timeout_s=self.spec.startup_timeout_s,
                )
            if self._child.alive and self._child.url is not None:
                return self._child.url
            try:
                return self._child.start()
            except ServerStartError as exc:
                raise ExternalEnvError(str(exc)) from exc

    def identity(self) -> dict[str, Any]:
        """What identifies the server: package and version, and its `/schema` and `/metadata`."""
        if self._identity is None:
            url = self.base_url()
            self._identity = {
                "package": self.spec.package,
                "package_version": installed_version(self.spec.package),
                "command": [p for p in self.spec.command if p != "{port}"] or None,
                "url": self.spec.url,
                "schema": self._get(url, "/schema"),
                "metadata": self._get(url, "/metadata"),
            }
        return self._identity

    def version(self) -> str:
        return content_hash(self.identity())

    def action_schema(self) -> dict[str, Any]:
        schema = self.identity()["schema"]
        action = schema.get("action") if isinstance(schema, dict) else None
        if not isinstance(action, dict):
            raise ExternalEnvError(f"OpenEnv server {self.spec.name!r}: /schema gives no action schema")
        return action

    def kill(self) -> None:
        """Stop the server (and everything it started); the next episode starts it again."""
        if self._child is not None:
            self._child.kill()

    def log_tail(self, chars: int = 2000) -> str:
        return self._child.log_tail(chars) if self._child is not None else ""

    # -- internals ---------------------------------------------------------------------------

    def _get(self, url: str, path: str) -> Any:
        try:
            response = httpx.get(url + path, timeout=self.spec.call_timeout_s)
        except httpx.HTTPError as exc:
            raise ExternalEnvError(f"OpenEnv server {self.spec.name!r}: GET {path} failed: {exc}") from exc
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise ExternalEnvError(
                f"OpenEnv server {self.spec.name!r}: GET {path} answered {response.status_code}"
            )
        return response.json()
