"""Shared fixtures: a real PostgreSQL server for the registry tests, and a fresh database per test.

`pg_url` uses `REPRORL_TEST_PG_URL` when it is set; otherwise it starts a throwaway cluster with the
local `initdb`/`pg_ctl` (as the `postgres` user when the tests run as root) and removes it at the
end of the session. Where neither is possible the PostgreSQL tests are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from reprorl.store import Store

PG_START_TIMEOUT_S = 30.0
PG_CMD_TIMEOUT_S = 60.0


def pytest_configure(config: pytest.Config) -> None:
    """Under `pytest -n N` (one worker per core) each worker, and every process it starts, computes
    on one thread: two workers of two threads each on two cores slow each other down many times."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        os.environ["MKL_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)


def _find_pg_bin() -> Path | None:
    """The folder holding initdb and pg_ctl: PATH first, then the Debian layout (newest version)."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).parent

    def version(path: Path) -> tuple[int, ...]:
        name = path.parent.name
        return tuple(int(p) for p in name.split(".") if p.isdigit())

    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True):
        if (candidate / "initdb").is_file() and (candidate / "pg_ctl").is_file():
            return candidate
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_as(user: pwd.struct_passwd | None, args: list[str], cwd: Path, timeout: float) -> None:
    """Run a PostgreSQL tool, as `user` when given (postgres refuses to run as root)."""
    kwargs: dict[str, Any] = {}
    env = dict(os.environ)
    if user is not None:
        kwargs.update(user=user.pw_uid, group=user.pw_gid, extra_groups=[])
        env.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
    done = subprocess.run(
        args,
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
        **kwargs,
    )
    if done.returncode != 0:
        output = (done.stdout + done.stderr).decode("utf-8", "replace").strip()
        raise RuntimeError(f"{Path(args[0]).name} exited with {done.returncode}: {output[-2000:]}")


def _wait_ready(url: str, deadline: float) -> None:
    import psycopg

    last: Exception | None = None
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(conninfo, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.Error as exc:
            last = exc
            time.sleep(0.2)
    raise RuntimeError(f"server did not accept connections within {PG_START_TIMEOUT_S:.0f}s: {last}")


def _create_database(admin_url: str, name: str) -> None:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()


def _drop_database(admin_url: str, name: str) -> None:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()


@contextlib.contextmanager
def _throwaway_cluster() -> Iterator[str]:
    """initdb + pg_ctl start in a temp dir; yields an admin URL; stops and removes it afterwards."""
    bindir = _find_pg_bin()
    if bindir is None:
        raise RuntimeError("initdb/pg_ctl not found on PATH or under /usr/lib/postgresql/*/bin")
    user: pwd.struct_passwd | None = None
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            raise RuntimeError("running as root and there is no 'postgres' user to run the server") from None
    # Not under pytest's tmp dir: that one is private to root and the server user must reach it.
    base = Path(tempfile.mkdtemp(prefix="reprorl-pg-"))
    data = base / "data"
    log = base / "server.log"
    started = False
    try:
        if user is not None:
            os.chown(base, user.pw_uid, user.pw_gid)
        _run_as(
            user,
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            cwd=base,
            timeout=PG_CMD_TIMEOUT_S,
        )
        port = _free_port()
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {base} -c fsync=off"
        _run_as(
            user,
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(log),
                "-o",
                options,
                "-w",
                "-t",
                str(int(PG_START_TIMEOUT_S)),
                "start",
            ],
            cwd=base,
            timeout=PG_START_TIMEOUT_S + 10,
        )
        started = True
        admin = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        _wait_ready(admin, time.monotonic() + PG_START_TIMEOUT_S)
        yield admin
    except RuntimeError as exc:
        tail = log.read_text(errors="replace")[-1000:] if log.exists() else ""
        raise RuntimeError(f"{exc}\n{tail}".strip()) from None
    finally:
        if started:
            with contextlib.suppress(Exception):
                _run_as(
                    user,
                    [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "-t", "30", "stop"],
                    cwd=base,
                    timeout=PG_CMD_TIMEOUT_S,
                )
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """A URL with the right to create databases: REPRORL_TEST_PG_URL, or a throwaway cluster."""
    env_url = os.environ.get("REPRORL_TEST_PG_URL")
    if env_url:
        yield env_url
        return
    try:
        cluster = _throwaway_cluster()
        admin = cluster.__enter__()
    except Exception as exc:
        if os.environ.get("REPRORL_REQUIRE_PG") == "1":  # CI: a missing server is a failure
            pytest.fail(f"no PostgreSQL server could be started: {exc}")
        pytest.skip(f"no PostgreSQL server could be started: {exc}")
    try:
        yield admin
    finally:
        cluster.__exit__(None, None, None)


@pytest.fixture(scope="session")
def pg_url(pg_admin_url: str) -> Iterator[str]:
    """A SQLAlchemy URL of a database for this session (`postgresql+psycopg://...`)."""
    if os.environ.get("REPRORL_TEST_PG_URL"):
        yield pg_admin_url
        return
    name = f"reprorl_session_{uuid.uuid4().hex[:12]}"
    _create_database(pg_admin_url, name)
    try:
        yield make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        _drop_database(pg_admin_url, name)


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty registry database for one test, on SQLite or on PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'registry-test.db'}"
        return
    pg_url = request.getfixturevalue("pg_url")
    name = f"reprorl_t_{uuid.uuid4().hex[:16]}"
    _create_database(pg_url, name)
    try:
        yield make_url(pg_url).set(database=name).render_as_string(hide_password=False)
    finally:
        _drop_database(pg_url, name)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A store under a fresh root with its default SQLite registry."""
    st = Store(root=tmp_path / "home")
    try:
        yield st
    finally:
        st.close()
