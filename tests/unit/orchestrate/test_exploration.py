"""Tool-level exploration: the oracle's needed tools, the calls that ran per step, and the alarm."""

from __future__ import annotations

import asyncio
from pathlib import Path

from reprorl.envs.families import files
from reprorl.hashing import content_hash
from reprorl.orchestrate.run.exploration import (
    ORACLE_EVENT,
    ExplorationWatch,
    find_needed_tools,
    oracle_tools,
)
from reprorl.policy import tiny_model
from reprorl.policy.chat import ChatRenderer
from reprorl.store import RunRecord, Store
from reprorl.types import Split, ToolOutcome, Trajectory
from rollout_records import make, result, turn

FAMILY_OF = {"f-0": "files", "f-1": "files", "c-0": "calculator"}


def _episode(task: str, *calls: tuple[str, ToolOutcome], success: bool = True) -> Trajectory:
    base = make(0, "answered" if success else "tool_timeout")
    turns = (turn(0, 0, *(result(name, outcome) for name, outcome in calls)),)
    return base.model_copy(update={"task_id": task, "turns": turns})


def test_the_needed_tools_are_those_that_ran_in_a_successful_demonstration() -> None:
    demos = [
        _episode("f-0", ("list_files", ToolOutcome.OK), ("read_file", ToolOutcome.TOOL_EXCEPTION)),
        _episode("f-1", ("write_file", ToolOutcome.OK), success=False),  # a failed demo needs nothing
        _episode("c-0", ("calculator", ToolOutcome.OK), ("bogus", ToolOutcome.UNKNOWN_TOOL)),
    ]
    assert oracle_tools(demos, FAMILY_OF) == {
        "calculator": ["calculator"],
        "files": ["list_files", "read_file"],
    }


def test_a_needed_tool_quiet_for_n_steps_that_drew_its_family_raises_one_alarm() -> None:
    watch = ExplorationWatch(
        {"files": ["read_file", "write_file"], "calculator": ["calculator"]}, alarm_steps=3
    )
    reads = _episode("f-0", ("read_file", ToolOutcome.OK), ("write_file", ToolOutcome.PERMISSION_DENIED))
    calc = _episode("c-0", ("calculator", ToolOutcome.OK))
    alarms = []
    for step in range(6):
        batch = [reads] if step != 2 else [calc]  # step 2 drew no files task: it does not count
        metrics = watch.metrics(batch, FAMILY_OF)
        assert ("exploration/files/write_file" in metrics) == (step != 2)
        if step != 2:
            assert (
                metrics["exploration/files/read_file"] == 1 and metrics["exploration/files/write_file"] == 0
            )
        alarms += [(step, a) for a in watch.observe(step, metrics)]
    # Refused calls did not run: write_file is quiet at steps 0, 1, 3 -> the alarm at step 3, once.
    assert alarms == [(3, {"family": "files", "tool": "write_file", "steps": [0, 1, 3]})]

    writes = _episode("f-0", ("write_file", ToolOutcome.OK))
    assert watch.observe(6, watch.metrics([writes], FAMILY_OF)) == []
    again = [watch.observe(s, watch.metrics([reads], FAMILY_OF)) for s in (7, 8, 9)]
    assert again[:2] == [[], []] and again[2][0]["steps"] == [7, 8, 9]  # quiet again: a new alarm


def test_a_resumed_watch_rebuilds_its_streaks_from_the_metric_lines() -> None:
    needed = {"files": ["write_file"]}
    unbroken = ExplorationWatch(needed, alarm_steps=4)
    quiet = _episode("f-0", ("read_file", ToolOutcome.OK))
    lines, fired = [], []
    for step in range(6):
        metrics = unbroken.metrics([quiet], FAMILY_OF)
        lines.append({"step": step, **metrics})
        fired.append(unbroken.observe(step, metrics))
    resumed = ExplorationWatch(needed, alarm_steps=4)
    resumed.replay([*lines, {"step": 0, "stage": "eval", "exploration/files/write_file": 5.0}], before=3)
    after = [resumed.observe(s, lines[s]) for s in range(3, 6)]
    assert after == fired[3:] and after[0][0]["steps"] == [0, 1, 2, 3]


def test_the_oracle_is_run_once_per_run_and_found_again_on_resume(tmp_path: Path) -> None:
    spec = {"name": "explore"}
    store = Store(tmp_path)
    record = RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name="explore", seeds={})
    tasks = files.generate(0, train=6, eval=0, holdout=0)[Split.TRAIN].tasks
    renderer = ChatRenderer(tiny_model(0).tokenizer)
    needed = asyncio.run(find_needed_tools(record, tasks, renderer, seed=0))
    assert "cat" in needed["files"] and set(needed["files"]) <= {"ls", "cat", "grep", "write_file", "move"}
    (event,) = [e for e in record.events().records if e["event"] == ORACLE_EVENT]
    assert event["solved"] == event["demonstrations"] == 6
    assert asyncio.run(find_needed_tools(record, tasks, renderer, seed=0)) == needed
    assert len([e for e in record.events().records if e["event"] == ORACLE_EVENT]) == 1
