"""SIGKILL a rollout writer mid-write: readers see whole part files or none, never a part of one."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reprorl.store.rollout_query import RolloutStore
from reprorl.store.rollouts import RolloutWriter
from rollout_records import RUN, batch

pytestmark = pytest.mark.slow


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "runs" / RUN
    path.mkdir(parents=True)
    return path


CHILD_TIMEOUT_S = 60.0

BLOCKED_WRITER = """
    import os, sys, time
    from pathlib import Path
    from reprorl.store.rollouts import RolloutWriter
    from reprorl.types import Trajectory

    lines = Path(sys.argv[2]).read_text().splitlines()
    trajectories = [Trajectory.model_validate_json(line) for line in lines]

    def stuck(fd):
        # The temp file holds every byte; the rename has not happened yet.
        print("WRITING", flush=True)
        time.sleep(60)

    os.fsync = stuck
    RolloutWriter(Path(sys.argv[1])).write(7, trajectories)
"""

LOOPING_WRITER = """
    import sys
    from pathlib import Path
    from reprorl.store.rollouts import RolloutWriter
    from reprorl.types import Trajectory

    lines = Path(sys.argv[2]).read_text().splitlines()
    trajectories = [Trajectory.model_validate_json(line) for line in lines]
    writer = RolloutWriter(Path(sys.argv[1]))
    step = int(sys.argv[3])
    while True:
        writer.write(step, trajectories)
        print("WROTE", flush=True)
        step += 1
"""


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[object]:
    env = dict(os.environ)
    src = Path(__file__).resolve().parents[3] / "src"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH")) if p)
    children: list[subprocess.Popen[bytes]] = []

    def start(code: str, *args: str) -> subprocess.Popen[bytes]:
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=CHILD_TIMEOUT_S)
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()


def wait_for(child: subprocess.Popen[bytes], expected: str) -> None:
    assert child.stdout is not None
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while time.monotonic() < deadline:
        line = child.stdout.readline().decode().strip()
        if line == expected:
            return
        if not line and child.poll() is not None:
            break
    child.kill()
    err = child.stderr.read().decode() if child.stderr else ""
    pytest.fail(f"child never printed {expected!r}:\n{err[-3000:]}")


def kill(child: subprocess.Popen[bytes]) -> None:
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=CHILD_TIMEOUT_S)
    assert child.returncode == -signal.SIGKILL


def test_a_writer_killed_before_its_rename_leaves_nothing_visible(
    tmp_path: Path, run_dir: Path, spawn: object
) -> None:
    assert callable(spawn)
    writer = RolloutWriter(run_dir)
    for step in range(3):
        writer.write(step, batch(step))
    source = tmp_path / "batch.jsonl"
    source.write_text("".join(t.model_dump_json() + "\n" for t in batch(7)))
    child = spawn(BLOCKED_WRITER, str(run_dir), str(source))
    wait_for(child, "WRITING")
    kill(child)

    leftovers = list((run_dir / "rollouts").rglob(".tmp-*"))
    assert len(leftovers) == 1 and leftovers[0].stat().st_size > 1000  # the whole file, unrenamed
    assert len(list((run_dir / "rollouts").rglob("part-*.parquet"))) == 3
    store = RolloutStore(run_dir)
    assert store.count() == 18 and store.count("step = 7") == 0
    assert RolloutWriter(run_dir).sweep_tmp(older_than_s=3600) == 0  # fresh leftovers are kept a while
    assert RolloutWriter(run_dir).sweep_tmp(older_than_s=0) == 1
    assert not list((run_dir / "rollouts").rglob(".tmp-*"))


def test_writers_killed_at_random_moments_never_leave_a_partial_part(
    tmp_path: Path, run_dir: Path, spawn: object
) -> None:
    assert callable(spawn)
    rows = batch(0, n=12)
    source = tmp_path / "batch.jsonl"
    source.write_text("".join(t.model_dump_json() + "\n" for t in rows))
    rng = random.Random(4)
    for attempt in range(4):
        child = spawn(LOOPING_WRITER, str(run_dir), str(source), str(attempt * 1000))
        wait_for(child, "WROTE")
        time.sleep(rng.uniform(0.0, 0.2))
        kill(child)
        store = RolloutStore(run_dir)
        parts = store.parts()  # every visible part verifies
        assert store.count() == len(parts) * len(rows)
        assert all(p.rows == len(rows) for p in parts)
