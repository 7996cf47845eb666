"""SIGKILL a writer mid-write: the store must show the old state or the new one, never a part.

Each test starts a real child process that writes through the store, waits until the child is
provably inside the write, kills it with SIGKILL (no cleanup handlers run), and inspects what a
fresh reader sees.
"""

from __future__ import annotations

import functools
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reprorl.errors import ArtifactNotFoundError, RunNotFoundError
from reprorl.hashing import content_hash
from reprorl.store import RunRecord, Store, find_run, iter_runs, new_run_id

pytestmark = pytest.mark.slow

CHILD_TIMEOUT_S = 60.0
CHUNK = 1 << 20
N_CHUNKS = 64  # the slow child would need over 3 s to finish: it is killed long before


def chunk(i: int) -> bytes:
    """Deterministic 1 MiB chunks, so the parent can write the same content again later."""
    return hashlib.sha256(str(i).encode()).digest() * (CHUNK // 32)


@functools.cache
def big_content_address() -> str:
    hasher = hashlib.sha256()
    for i in range(N_CHUNKS):
        hasher.update(chunk(i))
    return "sha256:" + hasher.hexdigest()


@pytest.fixture
def child_env() -> dict[str, str]:
    env = dict(os.environ)
    src = Path(__file__).resolve().parents[2] / "src"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH")) if p)
    env.pop("REPRORL_DB_URL", None)
    env.pop("REPRORL_HOME", None)
    return env


class Child:
    """A Python child process running `code`, with its stdout read line by line."""

    def __init__(self, code: str, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )

    def wait_for_line(self, expected: str) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode().strip()
            if line == expected:
                return
            if not line and self.proc.poll() is not None:
                break
        self.kill()
        err = self.proc.stderr.read().decode() if self.proc.stderr else ""
        pytest.fail(f"child never printed {expected!r} (exit {self.proc.returncode}):\n{err[-3000:]}")

    def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while time.monotonic() < deadline:
            if condition():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.001)
        self.kill()
        err = self.proc.stderr.read().decode() if self.proc.stderr else ""
        pytest.fail(f"child never reached {what} (exit {self.proc.returncode}):\n{err[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=CHILD_TIMEOUT_S)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        assert self.proc.returncode == -signal.SIGKILL


@pytest.fixture
def spawn(child_env: dict[str, str]) -> Iterator[Callable[..., Child]]:
    children: list[Child] = []

    def start(code: str, *args: str) -> Child:
        child = Child(code, child_env, *args)
        children.append(child)
        return child

    yield start
    for child in children:  # never leave a child behind, whatever the test did
        if child.proc.poll() is None:
            child.kill()


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


# -- artifacts -------------------------------------------------------------------------------------

SLOW_BLOB_WRITER = """
    import hashlib, sys, time
    from pathlib import Path
    from reprorl.store import Store

    CHUNK = 1 << 20

    def chunks():
        for i in range(int(sys.argv[2])):
            yield hashlib.sha256(str(i).encode()).digest() * (CHUNK // 32)
            if i == 2:
                print("WRITING", flush=True)  # three chunks have gone into the temp file
            time.sleep(0.05)

    store = Store(Path(sys.argv[1]))
    address, size = store.blobs._put_stream(chunks())
    store.registry.register("big-model", address, kind="model", size=size)  # as Store.add does
    print("DONE", flush=True)
"""


@pytest.mark.parametrize("had_registry", [True, False], ids=["existing-store", "empty-store"])
def test_kill_during_artifact_write(tmp_path: Path, spawn: Callable[..., Child], had_registry: bool) -> None:
    root = tmp_path / "home"
    before: set[str] = set()
    done_address = None
    if had_registry:
        with_store = Store(root)
        done_address = with_store.add_bytes("calc-train", b"completed earlier\n", kind="file").hash
        with_store.close()
        before = files_under(root)
        assert any(f.startswith("objects/") for f in before)

    child = spawn(SLOW_BLOB_WRITER, str(root), str(N_CHUNKS))
    child.wait_for_line("WRITING")
    child.kill()

    after = files_under(root)
    leftovers = after - before
    assert leftovers, "the killed writer should have left its partial temp file"
    assert all(f.startswith("tmp/") for f in leftovers), leftovers
    assert sorted(f for f in after if f.startswith("objects/")) == sorted(
        f for f in before if f.startswith("objects/")
    )
    partial = sum((root / f).stat().st_size for f in leftovers)
    assert 3 * CHUNK <= partial < N_CHUNKS * CHUNK

    store = Store(root)
    try:
        assert store.has_registry() is had_registry
        if had_registry:
            assert [v.name for v in store.registry.versions()] == ["calc-train"]
            assert store.read("calc-train@v1") == b"completed earlier\n"
        with pytest.raises(ArtifactNotFoundError):
            store.resolve("big-model@v1")
        assert store.blobs.fsck() == []
        assert not store.blobs.has(big_content_address())

        # Writing the same content again works and verifies.
        address, size = store.blobs._put_stream(chunk(i) for i in range(N_CHUNKS))
        assert (address, size) == (big_content_address(), N_CHUNKS * CHUNK)
        store.blobs.verify(address)
        version = store.registry.register("big-model", address, kind="model", size=size)
        assert version.version == 1
        assert store.resolve("big-model@v1").hash == address
        assert store.blobs.fsck() == []

        # Only tmp/ held the killed writer's leftovers, and sweeping removes them.
        assert store.blobs.sweep_tmp(older_than_s=0) == len(leftovers)
        assert list(store.blobs.tmp.iterdir()) == []
        assert {f for f in files_under(root) if not f.startswith("objects/")} <= {
            "registry.db",
            "registry.db-wal",
            "registry.db-shm",
        }
        if done_address is not None:
            assert store.blobs.get_bytes(done_address) == b"completed earlier\n"
    finally:
        store.close()


FILE_ADDER = """
    import sys
    from pathlib import Path
    from reprorl.store import Store

    store = Store(Path(sys.argv[1]))
    print("ADDING", flush=True)
    store.add("big-file", Path(sys.argv[2]))
    print("DONE", flush=True)
"""


def test_kill_during_store_add_of_a_large_file(tmp_path: Path, spawn: Callable[..., Child]) -> None:
    root = tmp_path / "home"
    store = Store(root)
    store.add_bytes("small", b"small\n", kind="file")
    store.close()
    before = files_under(root)
    big = tmp_path / "big.bin"
    with big.open("wb") as handle:  # 1 GiB of sparse zeros: reading and hashing it takes a while
        handle.truncate(1 << 30)

    child = spawn(FILE_ADDER, str(root), str(big))
    child.wait_for_line("ADDING")
    tmp_dir = root / "tmp"

    def temp_file_growing() -> bool:
        try:
            return any(p.stat().st_size >= 16 * CHUNK for p in tmp_dir.iterdir())
        except FileNotFoundError:
            return False

    child.wait_until(temp_file_growing, "a temp file of 16 MiB")
    child.kill()

    leftovers = files_under(root) - before
    assert leftovers and all(f.startswith("tmp/") for f in leftovers), leftovers
    store = Store(root)
    try:
        with pytest.raises(ArtifactNotFoundError):
            store.resolve("big-file@v1")
        assert [v.name for v in store.registry.versions()] == ["small"]
        assert store.blobs.fsck() == []
        assert store.blobs.sweep_tmp(older_than_s=0) == len(leftovers)
    finally:
        store.close()


# -- run records -----------------------------------------------------------------------------------

SLOW_RUN_CREATOR = """
    import sys
    from pathlib import Path
    from reprorl.hashing import content_hash
    from reprorl.store import RunRecord, Store

    spec = {"name": "huge", "rows": [{"i": i, "v": "abc"} for i in range(int(sys.argv[3]))]}
    spec_hash = content_hash(spec)
    store = Store(Path(sys.argv[1]))
    print("CREATING", flush=True)
    RunRecord.create(store, spec=spec, spec_hash=spec_hash, name="huge", seeds={}, run_id=sys.argv[2])
    print("DONE", flush=True)
"""


def test_kill_during_run_creation(tmp_path: Path, spawn: Callable[..., Child]) -> None:
    root = tmp_path / "home"
    store = Store(root)
    spec = {"name": "small"}
    earlier = RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name="small", seeds={})
    store.close()

    run_id = new_run_id()
    staging = root / "runs" / f".tmp-{run_id}"
    # A spec this size takes a second or two to serialise after the staging folder exists: time
    # for the kill to land even when a loaded machine is slow to notice the folder.
    child = spawn(SLOW_RUN_CREATOR, str(root), run_id, "1500000")
    child.wait_for_line("CREATING")
    child.wait_until(staging.is_dir, "the staging folder")
    child.kill()

    assert staging.is_dir(), "the kill should land while the record is being staged"
    assert not (root / "runs" / run_id).exists()

    store = Store(root)
    try:
        assert list(iter_runs(store)) == [earlier.run_id]
        with pytest.raises(RunNotFoundError):
            RunRecord(store, run_id)
        with pytest.raises(RunNotFoundError):
            # A prefix of the staged id alone (a timestamp prefix may also begin the earlier id).
            find_run(store, run_id[:-1])
        assert [e.run_id for e in store.registry.runs()] == [earlier.run_id]
        assert find_run(store, earlier.run_id).spec() == spec

        # The next run is created normally beside the leftover staging folder.
        again = RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name="again", seeds={})
        assert set(iter_runs(store)) == {earlier.run_id, again.run_id}
        again.info()
    finally:
        store.close()


METRICS_WRITER = """
    import sys
    from pathlib import Path
    from reprorl.store import RunRecord, Store

    record = RunRecord(Store(Path(sys.argv[1])), sys.argv[2])
    step = 0
    while True:
        record.log_metrics(step, {"loss": 1.0 / (step + 1), "reward": step * 0.5})
        if step == 50:
            print("LOGGING", flush=True)
        step += 1
"""


def test_kill_during_metric_appends_and_torn_last_line(tmp_path: Path, spawn: Callable[..., Child]) -> None:
    root = tmp_path / "home"
    store = Store(root)
    spec = {"name": "train"}
    record = RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name="train", seeds={})

    child = spawn(METRICS_WRITER, str(root), record.run_id)
    child.wait_for_line("LOGGING")
    time.sleep(0.05)
    child.kill()

    metrics = record.metrics()
    n = len(metrics.records)
    assert n > 50
    assert metrics.bad_lines == []  # every append that happened, happened whole
    assert [m["step"] for m in metrics.records] == list(range(n))
    assert metrics.records[4]["loss"] == 0.2

    # A power cut can tear the last line; simulate one by cutting it short.
    path = record.path / "metrics.jsonl"
    data = path.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    path.write_bytes(data[: last_start + (len(data) - last_start) // 2])

    torn = record.metrics()
    assert torn.bad_lines == [n]
    assert [m["step"] for m in torn.records] == list(range(n - 1))

    # A writer that resumes after the crash must not glue its first line onto the torn one.
    record.log_metrics(n - 1, {"loss": 0.0, "reward": 1.0}, resumed=True)
    resumed = record.metrics()
    assert resumed.bad_lines == [n]
    assert [m["step"] for m in resumed.records] == list(range(n))
    assert resumed.records[-1]["resumed"] is True
    record.info()  # the rest of the record is intact
    store.close()
