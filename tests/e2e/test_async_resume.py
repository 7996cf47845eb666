"""SIGKILL an asynchronous run while its queue holds sampled batches: the resume trains on those very
batches (read back, not sampled again), loses none, and ends bit-identical to an unbroken run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_ids, tiny_home

from reprorl.config import RunSpec
from reprorl.orchestrate.jobs.reproduce import result_figures
from reprorl.orchestrate.pipeline.timing import ScheduleError, read_schedule
from reprorl.orchestrate.run.checkpoint import latest_checkpoint
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore

pytestmark = pytest.mark.slow

STEPS, TASKS, GROUP = 6, 2, 2
SPEC = f"""
name = "tiny-async-resume"
seed = 13
[model]
owner = "t@x"
base = "tiny"
adapter = {{ kind = "lora", rank = 4, alpha = 8.0, targets = ["q_proj", "v_proj"] }}
[data]
owner = "t@x"
train = "calc-train"
reward_weights = {{ outcome = 1.0, valid_calls = 1.0 }}
[learning]
owner = "t@x"
pipeline = {{ max_staleness = 2 }}
steps = {STEPS}
lr = 1e-3
group_size = {GROUP}
tasks_per_step = {TASKS}
max_tokens = 12
max_turns = 2
drop_zero_variance_groups = false
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
every_steps = 100
"""

CLI = "import sys; from reprorl.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _home(tmp_path: Path, name: str) -> Path:
    (tmp_path / "spec.toml").write_text(SPEC)
    return tiny_home(tmp_path, name)


def _start(home: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", CLI, "--debug", "--home", str(home), "run", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _buffered(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The sampled, untrained work a checkpoint's queue holds: batches, or finished groups."""
    if "started" in state:
        return [g for g in state["started"] if g["part"] is not None]
    return list(state["buffered"])


def _buffered_checkpoint(home: Path, seen: set[tuple[str, int]]) -> bool:
    """Whether the run has a new checkpoint (not in `seen`) whose queue holds untrained samples."""
    for run in run_ids(home):
        for pipeline in (home / "runs" / run / "checkpoints").glob("step-*/pipeline.json"):
            try:
                key = (pipeline.parent.name, pipeline.stat().st_mtime_ns)
                if key not in seen and _buffered(json.loads(pipeline.read_text())):
                    return True
            except (OSError, ValueError):
                pass  # being written or replaced
    return False


def _checkpoints(home: Path) -> set[tuple[str, int]]:
    return {
        (p.parent.name, p.stat().st_mtime_ns)
        for run in run_ids(home)
        for p in (home / "runs" / run / "checkpoints").glob("step-*/pipeline.json")
    }


def _outcome(home: Path) -> dict[str, Any]:
    (run_id,) = run_ids(home)
    record = RunRecord(Store(home), run_id)
    assert record.status()["status"] == "succeeded"
    rollouts = sorted(
        (t.rollout_id.split("/", 1)[1], t.policy_version, [x.token_ids for x in t.turns])
        for t in RolloutStore(record).trajectories()
    )
    saved = [e["adapter"] for e in record.events().records if e.get("event") == "adapter_saved"]
    return {"adapter": saved[-1], "metrics": result_figures(record), "rollouts": rollouts}


def _kill_at_buffered_checkpoints(home: Path, spec: Path, kills: int) -> list[dict[str, Any]]:
    """Run, SIGKILL the run whenever a new checkpoint holds untrained samples, resume; up to
    `kills` times. Returns each killed checkpoint's pipeline state."""
    states: list[dict[str, Any]] = []
    proc = _start(home, str(spec))
    seen: set[tuple[str, int]] = set()
    while len(states) < kills:
        deadline = time.perf_counter() + 300
        while proc.poll() is None and not _buffered_checkpoint(home, seen) and time.perf_counter() < deadline:
            time.sleep(0.01)
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        (run_id,) = run_ids(home)
        checkpoint = latest_checkpoint(RunRecord(Store(home), run_id))
        assert checkpoint is not None
        states.append(json.loads((checkpoint.path / "pipeline.json").read_text()))
        seen = _checkpoints(home)
        proc = _start(home, "--resume", run_id)
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    return states


def test_a_killed_arrival_run_keeps_every_finished_group_and_trains_each_once(tmp_path: Path) -> None:
    """Arrival order: the checkpoint names its finished groups by part and its running ones by
    version; after SIGKILL the resume reads the finished ones back (counted), samples only the
    others again, and every planned group is trained exactly once."""
    (tmp_path / "spec.toml").write_text(
        SPEC.replace(
            "pipeline = { max_staleness = 2 }",
            'pipeline = { max_staleness = 2, source = "arrival", lockstep = "ready" }',
        )
    )
    home = tiny_home(tmp_path, "killed")
    states = _kill_at_buffered_checkpoints(home, tmp_path / "spec.toml", kills=2)
    (run_id,) = run_ids(home)
    record = RunRecord(Store(home), run_id)
    events = record.events().records
    restores = [e for e in events if e.get("event") == "buffers_restored"]
    assert len(restores) == len(states) >= 1
    assert any(_buffered(s) for s in states), "no kill fell while the queue held a finished group"
    for restored, state in zip(restores, states, strict=True):
        kept = {g["group"] for g in restored["groups"]}
        assert {g["group"] for g in _buffered(state)} <= kept
        assert restored["rollouts"] == len(kept) * GROUP
        running = {g["group"] for g in state["started"] if g["part"] is None}
        assert {g["group"] for g in restored["resampled"]} | (kept & running) == running
    # The batches that count: each step's last assembly (a resume redoes the steps after its checkpoint).
    final = {e["step"]: e for e in events if e.get("event") == "batch_assembled"}
    assert sorted(final) == list(range(STEPS))
    trained = sorted(g["group"] for e in final.values() for g in e["groups"])
    assert trained == list(range(STEPS * TASKS))
    assert all(e["step"] - g["version"] <= 2 for e in final.values() for g in e["groups"])
    ids = [t.rollout_id for t in RolloutStore(record).trajectories("split = 'train' AND NOT retried")]
    assert len(ids) == len(set(ids)) == STEPS * TASKS * GROUP
    # Groups sampled again after a kill were batched twice: no single schedule to follow.
    with pytest.raises(ScheduleError, match="resumed"):
        read_schedule(record, RunSpec.model_validate(record.spec()))


def test_a_killed_async_run_keeps_every_buffered_sample(tmp_path: Path) -> None:
    reference_home = _home(tmp_path, "reference")
    proc = _start(reference_home, str(tmp_path / "spec.toml"))
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    reference = _outcome(reference_home)

    home = _home(tmp_path, "killed")
    buffered_at_kill = [_buffered(s) for s in _kill_at_buffered_checkpoints(home, tmp_path / "spec.toml", 2)]

    (run_id,) = run_ids(home)
    record = RunRecord(Store(home), run_id)
    events = record.events().records
    restores = [e for e in events if e.get("event") == "buffers_restored"]
    assert len(restores) == len(buffered_at_kill) >= 1
    assert any(buffered_at_kill), "no kill fell while the queue held a batch"
    for restored, buffered in zip(restores, buffered_at_kill, strict=True):
        # Every batch the checkpoint held came back from its own part, and its rows are counted.
        kept = {b["part"] for b in restored["batches"]}
        assert {b["part"] for b in buffered} <= kept
        assert restored["rollouts"] == len(restored["batches"]) * TASKS * GROUP
    # None of the restored batches was sampled again after its resume.
    for i, event in enumerate(events):
        if event.get("event") != "buffers_restored":
            continue
        steps = {b["step"] for b in event["batches"]}
        later = events[i + 1 :]
        end = next((j for j, e in enumerate(later) if e.get("event") == "resumed"), len(later))
        rewritten = {e["step"] for e in later[:end] if e.get("event") == "rollouts_written"}
        assert not steps & rewritten, steps & rewritten
    # Each planned rollout is stored exactly once, and the result is the unbroken run's.
    ids = [t.rollout_id for t in RolloutStore(record).trajectories("split = 'train' AND NOT retried")]
    assert len(ids) == len(set(ids)) == STEPS * TASKS * GROUP
    outcome = _outcome(home)
    assert outcome["rollouts"] == reference["rollouts"]
    assert outcome["metrics"] == reference["metrics"]
    assert outcome["adapter"] == reference["adapter"]
