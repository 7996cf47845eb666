"""A server process reprorl starts and owns: on a free port of 127.0.0.1, waited for, killed with its run.

An OpenEnv environment server and a vLLM inference server are both such children. Each is started in
a session of its own (so killing it kills what it started), dies with its starter even when that is
SIGKILLed (PR_SET_PDEATHSIG) and is killed at exit; its output goes to a log file whose tail names
what went wrong when it does not come up.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx


class ServerStartError(Exception):
    """The server could not be started, exited while starting, or never answered its health check."""


class LocalServer:
    """One child server: `start()` runs `argv` ("{port}" replaced by the port picked, "{host}" in it
    and in `env` by `host`) until `health` answers 200; `kill()` stops it and its children; `alive`
    says whether it still runs."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        health: str = "/health",
        startup_timeout_s: float = 60.0,
        log_dir: Path | None = None,
        keep_log: bool = False,
        host: str = "127.0.0.1",
    ) -> None:
        self.name, self.argv, self.health, self.host = name, tuple(argv), health, host
        self.env = {k: v.replace("{host}", host) for k, v in (env or {}).items()}
        self.startup_timeout_s, self.log_dir, self.keep_log = startup_timeout_s, log_dir, keep_log
        self.process: subprocess.Popen[bytes] | None = None
        self.url: str | None = None
        self.log: Path | None = None
        self.starts = 0

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None and self.url is not None

    def start(self) -> str:
        """Start (or start again) and return the server's URL once it is healthy."""
        self.kill()
        port = free_port()
        argv = [part.replace("{port}", str(port)).replace("{host}", self.host) for part in self.argv]
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        prefix = "reprorl-" + re.sub(r"[^A-Za-z0-9_]+", "-", self.name).strip("-").lower()
        handle, log = tempfile.mkstemp(prefix=f"{prefix}-", suffix=".log", dir=self.log_dir)
        self.log = Path(log)
        try:
            # PR_SET_PDEATHSIG fires when the forking *thread* ends, so every child is forked by one
            # thread that lives as long as this process, whichever thread asked for the start.
            self.process = _LAUNCHER.submit(
                subprocess.Popen,
                argv,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=handle,
                env={**os.environ, **self.env},
                start_new_session=True,
                preexec_fn=_die_with_parent,
            ).result()
        except OSError as exc:
            raise ServerStartError(f"{self.name} could not start: {exc}") from exc
        finally:
            os.close(handle)
        self.starts += 1
        _STARTED.append(self)
        url = f"http://{self.host}:{port}"
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                raise ServerStartError(f"{self.name} exited with {code} while starting: {self.log_tail(500)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}{self.health}", timeout=2.0).status_code == 200:
                    self.url = url
                    return url
            time.sleep(0.05)
        tail = self.log_tail(500)
        self.kill()
        raise ServerStartError(
            f"{self.name} did not answer {self.health} within {self.startup_timeout_s:.0f} s: {tail}"
        )

    def kill(self) -> None:
        """Stop the server and everything it started; idempotent."""
        process, self.process, self.url = self.process, None, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        log, self.log = self.log, None
        if log is not None and not self.keep_log:
            log.unlink(missing_ok=True)  # its tail went into any error that needed it

    def log_tail(self, chars: int = 2000) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")[-chars:]


def _die_with_parent() -> None:
    # Killed with its starter even when that one is SIGKILLed and no atexit runs (PR_SET_PDEATHSIG).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_STARTED: list[LocalServer] = []
_LAUNCHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reprorl-launcher")


@atexit.register
def _stop_all() -> None:
    # A server reprorl started never outlives the process that started it.
    for server in _STARTED:
        server.kill()
