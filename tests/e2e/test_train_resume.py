"""SIGKILL a training run at random points, resume it each time: it ends bit-identical to an unbroken run
(its in-loop screening, whose draws depend on every earlier step, included)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_ids, tiny_home

from reprorl.orchestrate.jobs.reproduce import result_figures
from reprorl.store import RunRecord, Store, read_log
from reprorl.store.rollout_query import RolloutStore

pytestmark = pytest.mark.slow

SPEC = """
name = "tiny-resume"
seed = 11
[model]
owner = "t@x"
base = "tiny"
adapter = { kind = "lora", rank = 4, alpha = 8.0, targets = ["q_proj", "v_proj"] }
[data]
owner = "t@x"
train = "calc-six"
# The tiny model never answers right; a component that varies gives its groups a signal.
reward_weights = { outcome = 1.0, valid_calls = 1.0 }
# Six tasks, two a step: a task that taught nothing rests, so later draws depend on earlier steps.
screen = { rest_steps = 2 }
[learning]
owner = "t@x"
loss = "ppo_ewma"
steps = 4
sft_steps = 2
lr = 1e-3
group_size = 2
tasks_per_step = 2
max_tokens = 12
max_turns = 2
drop_zero_variance_groups = false
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
every_steps = 2
"""

CLI = "import sys; from reprorl.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _home(tmp_path: Path, name: str) -> Path:
    (tmp_path / "spec.toml").write_text(SPEC)
    home = tiny_home(tmp_path, name)
    with resources.as_file(resources.files("reprorl") / "examples" / "calc-train.jsonl") as path:
        (tmp_path / "six.jsonl").write_text("".join(path.read_text().splitlines(keepends=True)[:6]))
    Store(home).add("calc-six", tmp_path / "six.jsonl", kind="taskset")
    return home


def _start(home: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": str(os.cpu_count() or 1)}
    return subprocess.Popen(
        [sys.executable, "-c", CLI, "--home", str(home), "run", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen[bytes]) -> None:
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-2000:]


def _await_record(home: Path, proc: subprocess.Popen[bytes]) -> float:
    """When the run's record appeared (or the process ended first)."""
    deadline = time.perf_counter() + 120
    while not run_ids(home) and proc.poll() is None and time.perf_counter() < deadline:
        time.sleep(0.02)
    return time.perf_counter()


def _resumes(home: Path) -> int:
    runs = run_ids(home)
    if not runs:
        return 0
    return sum(
        e.get("event") == "resumed" for e in read_log(home / "runs" / runs[0] / "events.jsonl").records
    )


def _await_start(home: Path, proc: subprocess.Popen[bytes], resumes: int) -> None:
    """Until the process works on the run: its record is there, and a resume has loaded its checkpoint
    (its `resumed` event is the one after `resumes`), or the process ended first."""
    if resumes < 0:
        _await_record(home, proc)
        return
    deadline = time.perf_counter() + 120
    while _resumes(home) <= resumes and proc.poll() is None and time.perf_counter() < deadline:
        time.sleep(0.02)


def _outcome(home: Path) -> dict[str, Any]:
    """What must not depend on interruptions: the adapter, every metric, every sampled token."""
    store = Store(home)
    (run_id,) = run_ids(home)
    record = RunRecord(store, run_id)
    assert record.status()["status"] == "succeeded"
    metrics = result_figures(record)  # wall-clock figures set aside
    rollouts = sorted(
        (t.rollout_id.split("/", 1)[1], t.reward.total if t.reward else None, [x.token_ids for x in t.turns])
        for t in RolloutStore(record).trajectories()
    )
    saved = [e["adapter"] for e in record.events().records if e.get("event") == "adapter_saved"]
    return {"adapter": saved[-1], "metrics": metrics, "rollouts": rollouts}


def test_a_run_killed_at_random_points_resumes_to_the_same_adapter(tmp_path: Path) -> None:
    reference_home = _home(tmp_path, "reference")
    started = time.perf_counter()
    proc = _start(reference_home, str(tmp_path / "spec.toml"))
    recorded = _await_record(reference_home, proc) - started
    _finish(proc)
    # How long the run works once it has a record (start-up, model load and the leakage check
    # take `recorded` before): the kills fall at random points of that.
    duration = time.perf_counter() - started - recorded
    reference = _outcome(reference_home)

    home = _home(tmp_path, "killed")
    rng = random.Random(20261130)
    kills = 0
    while kills < 4:
        runs = run_ids(home)
        resumes = _resumes(home) if runs else -1
        proc = _start(home, "--resume", runs[0]) if runs else _start(home, str(tmp_path / "spec.toml"))
        # The random point is counted from when this process starts working on the run: a kill
        # while the model loads leaves nothing new to resume from and would not test resuming.
        # Each piece is under a quarter of the work, so three kills land before the run can end
        # even when the reference run was slowed by a busy machine.
        _await_start(home, proc, resumes)
        time.sleep(rng.uniform(0.05, 0.25) * duration)
        if proc.poll() is not None:  # it finished before the kill came
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
    runs = run_ids(home)
    record = RunRecord(Store(home), runs[0])
    if record.status()["status"] != "succeeded":
        _finish(_start(home, "--resume", runs[0]))
    resumed = [e for e in record.events().records if e.get("event") == "resumed"]
    assert kills >= 3 and len(resumed) >= 2, (kills, resumed)

    outcome = _outcome(home)
    assert len(outcome["metrics"]) == len(reference["metrics"])
    for got, want in zip(outcome["metrics"], reference["metrics"], strict=True):
        differing = {
            k: (got.get(k), want.get(k)) for k in got.keys() | want.keys() if got.get(k) != want.get(k)
        }
        assert not differing, (want.get("step"), want.get("stage"), differing)
    assert outcome["rollouts"] == reference["rollouts"]
    assert outcome["adapter"] == reference["adapter"]
