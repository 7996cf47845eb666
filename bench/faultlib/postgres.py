"""A throwaway PostgreSQL cluster on 127.0.0.1 that a fault can stop and start again."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any


def _bindir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name))
    if found:  # Debian's layout first: its tools are all in one folder
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
    return Path(initdb).parent


class Cluster:
    """initdb into a temp folder, served as the `postgres` user when run as root."""

    def __init__(self, scratch: Path) -> None:
        del scratch  # the server user must reach the folder: a fresh one under /tmp
        self.base = Path(tempfile.mkdtemp(prefix="reprorl-faults-pg-"))
        self.bindir = _bindir()
        self.user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])

    def _run(self, *args: str) -> None:
        kwargs: dict[str, Any] = {}
        if self.user is not None:
            kwargs.update(user=self.user.pw_uid, group=self.user.pw_gid, extra_groups=[])
        subprocess.run(args, cwd=self.base, check=True, capture_output=True, timeout=60, **kwargs)

    def __enter__(self) -> Cluster:
        if self.user is not None:
            os.chown(self.base, self.user.pw_uid, self.user.pw_gid)
        data = str(self.base / "data")
        self._run(str(self.bindir / "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "--no-sync")
        self.start()
        return self

    def start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.base} -c fsync=off"
        log = str(self.base / "server.log")
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.base / "data"),
            "-l",
            log,
            "-o",
            options,
            "-w",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.base / "data"), "-m", mode, "-w", "stop")

    def database(self, name: str) -> str:
        self._run(
            str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name
        )
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def __exit__(
        self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]
    ) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)
