"""An OpenEnv server as a run uses it: started on 127.0.0.1 (or reached at a URL), identified, restarted.

reprorl starts the server's command itself, on a free port of 127.0.0.1, the first time an episode
needs it, and waits for `/health`; a server that died is started again by the next episode that
needs it (the episode that saw it die is the platform's failure, retried). A server given by URL is
used as it is. The server's identity — its package and version, and what it says of itself at
`/schema` and `/metadata` — is hashed into the env's version, so a changed server is a changed env.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from reprorl.envs.outside import installed_version
from reprorl.errors import UserInputError
from reprorl.hashing import content_hash


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
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _url: str | None = None
    _log: Path | None = None
    _identity: dict[str, Any] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    starts: int = 0

    def base_url(self) -> str:
        """The server's URL, starting (or restarting) it when it is not running."""
        if self.spec.url is not None:
            return self.spec.url.rstrip("/")
        with self._lock:
            if self._process is not None and self._process.poll() is None and self._url is not None:
                return self._url
            self._start()
            assert self._url is not None
            return self._url

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
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        log, self._log = self._log, None
        if log is not None:
            log.unlink(missing_ok=True)  # its tail went into any error that needed it

    def log_tail(self, chars: int = 2000) -> str:
        if self._log is None or not self._log.exists():
            return ""
        return self._log.read_text(errors="replace")[-chars:]

    # -- internals ---------------------------------------------------------------------------

    def _start(self) -> None:
        self.kill()
        port = _free_port()
        argv = [part.replace("{port}", str(port)) for part in self.spec.command]
        handle, log = tempfile.mkstemp(prefix="reprorl-openenv-", suffix=".log")
        self._log = Path(log)
        try:
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=handle,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            raise ExternalEnvError(f"OpenEnv server {self.spec.name!r} could not start: {exc}") from exc
        finally:
            os.close(handle)
        self.starts += 1
        _STARTED.append(self)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.spec.startup_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ExternalEnvError(
                    f"OpenEnv server {self.spec.name!r} exited with {self._process.returncode} "
                    f"while starting: {self.log_tail(500)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                    self._url = url
                    return
            time.sleep(0.05)
        tail = self.log_tail(500)
        self.kill()
        raise ExternalEnvError(
            f"OpenEnv server {self.spec.name!r} did not answer /health within "
            f"{self.spec.startup_timeout_s:.0f} s: {tail}"
        )

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


def _die_with_parent() -> None:
    # Killed with its starter even when that one is SIGKILLed and no atexit runs (PR_SET_PDEATHSIG).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_STARTED: list[OpenEnvServer] = []


@atexit.register
def _stop_all() -> None:
    # A server reprorl started never outlives the process that started it.
    for server in _STARTED:
        server.kill()
