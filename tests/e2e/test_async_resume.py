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

from reprorl.orchestrate.checkpoint import latest_checkpoint
from reprorl.orchestrate.reproduce import result_figures
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
mode = "async"
max_staleness = 2
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
        [sys.executable, "-c", CLI, "--home", str(home), "run", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _buffered_checkpoint(home: Path, seen: set[tuple[str, int]]) -> bool:
    """Whether the run has a new checkpoint (not in `seen`) whose queue holds an untrained batch."""
    for run in run_ids(home):
        for pipeline in (home / "runs" / run / "checkpoints").glob("step-*/pipeline.json"):
            try:
                key = (pipeline.parent.name, pipeline.stat().st_mtime_ns)
                if key not in seen and json.loads(pipeline.read_text())["buffered"]:
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


def test_a_killed_async_run_keeps_every_buffered_sample(tmp_path: Path) -> None:
    reference_home = _home(tmp_path, "reference")
    proc = _start(reference_home, str(tmp_path / "spec.toml"))
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    reference = _outcome(reference_home)

    home = _home(tmp_path, "killed")
    buffered_at_kill: list[list[dict[str, Any]]] = []
    proc = _start(home, str(tmp_path / "spec.toml"))
    seen: set[tuple[str, int]] = set()
    while len(buffered_at_kill) < 2:
        deadline = time.perf_counter() + 300
        while proc.poll() is None and not _buffered_checkpoint(home, seen) and time.perf_counter() < deadline:
            time.sleep(0.01)
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        (run_id,) = run_ids(home)
        record = RunRecord(Store(home), run_id)
        checkpoint = latest_checkpoint(record)
        assert checkpoint is not None
        buffered = json.loads((checkpoint.path / "pipeline.json").read_text())["buffered"]
        buffered_at_kill.append(buffered)
        seen = _checkpoints(home)
        proc = _start(home, "--resume", run_id)
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""

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
