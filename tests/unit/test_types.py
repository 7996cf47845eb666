"""Records: frozen, strict, versioned; task sets versioned by canonical content."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from reprorl.errors import UserInputError
from reprorl.types import (
    SCHEMA_VERSION,
    Message,
    Reward,
    Role,
    Split,
    Task,
    TaskSet,
    Termination,
    ToolCall,
    ToolOutcome,
    ToolResult,
    Trajectory,
    Turn,
)


def _task(i: int, question: str = "What is 2 + 2?", split: Split = Split.TRAIN) -> Task:
    return Task(
        id=f"t{i}",
        family="calculator",
        prompt=(Message(role=Role.USER, content=question),),
        tools=("calculator",),
        reference={"answer": 4},
        split=split,
    )


def test_records_are_frozen_and_refuse_unknown_fields() -> None:
    task = _task(0)
    with pytest.raises(ValidationError):
        task.id = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="extra"):
        Task.model_validate({**task.to_json_dict(), "surprise": 1})
    assert task.schema_version == SCHEMA_VERSION


def test_task_hash_changes_with_content_only() -> None:
    assert _task(0).content_hash == _task(0).content_hash
    assert _task(0).content_hash != _task(0, "What is 2 + 3?").content_hash
    assert _task(0).content_hash != _task(0, split=Split.EVAL).content_hash


def test_taskset_version_ignores_name_and_formatting() -> None:
    tasks = (_task(0), _task(1))
    a = TaskSet(name="a", tasks=tasks)
    b = TaskSet(name="b", tasks=tasks)
    assert a.version == b.version
    pretty = "\n\n".join(json.dumps(t.to_json_dict(), indent=2).replace("\n", " ") for t in tasks)
    reparsed = TaskSet.from_jsonl("c", pretty.encode())
    assert reparsed.version == a.version
    assert reparsed.to_jsonl() == a.to_jsonl()
    changed = TaskSet(name="a", tasks=(_task(0), _task(1, "What is 5 + 5?")))
    assert changed.version != a.version
    reordered = TaskSet(name="a", tasks=(tasks[1], tasks[0]))
    assert reordered.version != a.version  # order is part of a task set


def test_taskset_accepts_a_json_array() -> None:
    tasks = [_task(0).to_json_dict(), _task(1).to_json_dict()]
    parsed = TaskSet.from_jsonl("x", json.dumps(tasks).encode())
    assert [t.id for t in parsed.tasks] == ["t0", "t1"]
    assert parsed.split(Split.TRAIN) == parsed.tasks
    assert parsed.split(Split.EVAL) == ()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"id": "a"', "tasks.jsonl:1: not valid JSON"),
        ('{"id": "a", "family": "f"}', "tasks.jsonl:1: prompt"),
        ('{"id": "", "family": "f", "prompt": [{"role": "user", "content": "x"}]}', ":1: id"),
        ('{"id": "a", "family": "f", "prompt": [{"role": "robot", "content": "x"}]}', "prompt.0.role"),
        (
            '{"id": "a", "family": "f", "prompt": [{"role": "user", "content": "x"}]}\n'
            '{"id": "a", "family": "f", "prompt": [{"role": "user", "content": "y"}]}',
            "appears twice",
        ),
        (
            '{"id": "a", "family": "f", "split": "test", "prompt": [{"role": "user", "content": "x"}]}',
            "split",
        ),
    ],
)
def test_taskset_errors_name_line_and_field(text: str, needle: str) -> None:
    with pytest.raises(UserInputError) as caught:
        TaskSet.from_jsonl("x", text.encode(), source="tasks.jsonl")
    assert needle in str(caught.value)
    assert "\n" not in str(caught.value)


def test_trajectory_round_trips_through_json() -> None:
    call = ToolCall(id="c1", name="calculator", arguments={"expression": "2+2"})
    turn = Turn(
        index=0,
        token_ids=(1, 2, 3),
        logprobs=(-0.1, -0.2, -0.3),
        text="<tool_call>…</tool_call>",
        tool_calls=(call,),
        tool_results=(ToolResult(call_id="c1", name="calculator", outcome=ToolOutcome.OK, content="4"),),
        policy_version="adapter@sha256:ab/step-3",
        finish_reason="tool_call",
    )
    trajectory = Trajectory(
        run_id="r",
        rollout_id="r/0",
        split=Split.TRAIN,
        task_id="t0",
        task_hash=_task(0).content_hash,
        turns=(turn,),
        reward=Reward(total=1.0, components={"answer": 1.0}, verifier_version="v"),
        termination=Termination.ANSWERED,
    )
    again = Trajectory.model_validate_json(trajectory.model_dump_json())
    assert again == trajectory
    assert again.tool_outcomes() == [ToolOutcome.OK]


def test_turn_refuses_positive_or_nan_logprobs() -> None:
    with pytest.raises(ValidationError, match="logprobs"):
        Turn(index=0, logprobs=(0.5,))
    with pytest.raises(ValidationError, match="logprobs"):
        Turn(index=0, logprobs=(float("nan"),))
