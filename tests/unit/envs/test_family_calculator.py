"""The calculator family: a safe evaluator, deterministic splits, an oracle that always solves."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from reprorl.actions import parse_action
from reprorl.envs.errors import InvalidArguments
from reprorl.envs.families.calculator import calc, evaluate, generate, oracle
from reprorl.rewards import FinalState
from reprorl.rewards.verifiers.numeric import NumericAnswer
from reprorl.types import Message, Role, Split, Termination


@pytest.mark.parametrize(
    ("expression", "value"),
    [("2 + 3 * 4", 14), ("(2 + 3) * 4", 20), ("7 / 2", 3.5), ("7 // 2", 3), ("-3 ** 2", -9), ("2^10", 1024)],
)
def test_evaluate(expression: str, value: float) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression",
    ["__import__('os')", "a + 1", "(1).real", "9 ** 9 ** 9", "1 / 0", "10 ** 40", "[1, 2]", "1 +", "x" * 300],
)
def test_evaluate_refuses(expression: str) -> None:
    with pytest.raises(InvalidArguments):
        evaluate(expression)


def test_calc_tool_formats_numbers() -> None:
    ctx = SimpleNamespace(root=".")
    assert calc(ctx, expression="6 * 7") == "42"
    assert calc(ctx, expression="1 / 4") == "0.25"
    assert calc(ctx, expression="10 / 2") == "5"


def test_generation_is_deterministic_disjoint_and_tagged() -> None:
    first, again, other = generate(3), generate(3), generate(4)
    assert {s: t.version for s, t in first.items()} == {s: t.version for s, t in again.items()}
    assert first[Split.EVAL].version != other[Split.EVAL].version
    prompts = {s: {t.prompt[-1].content for t in ts.tasks} for s, ts in first.items()}
    assert not (prompts[Split.TRAIN] & prompts[Split.EVAL]) and not (
        prompts[Split.EVAL] & prompts[Split.HOLDOUT]
    )
    assert len(first[Split.TRAIN].tasks) == 64 and len(first[Split.EVAL].tasks) == 32
    for split, tasks in first.items():
        assert all(t.split == split and t.family == "calculator" and t.difficulty >= 1 for t in tasks.tasks)
        assert ["required" in t.tags for t in tasks.tasks[:3]] == [True, True, False]
    # More train tasks never change the eval split.
    assert generate(3, train=100)[Split.EVAL].version == first[Split.EVAL].version


def _play(task_messages: list[Message], script_task: object) -> str:
    """Run the oracle against the calc tool directly (no sandbox), return its final answer."""
    messages = list(task_messages)
    for _ in range(5):
        text = oracle(script_task, messages)  # type: ignore[arg-type]
        action = parse_action(text)
        if action.is_final:
            return action.answer
        for call in action.tool_calls:
            messages.append(
                Message(role=Role.TOOL, content=calc(SimpleNamespace(root="."), **call.arguments))
            )
    raise AssertionError("the oracle did not answer")


def test_oracle_solves_every_eval_task_and_guessing_does_not(tmp_path: Path) -> None:
    tasks = generate(0)[Split.EVAL].tasks
    verifier = NumericAnswer()
    solved = guessed = 0.0
    for task in tasks:
        answer = _play(list(task.prompt), task)
        solved += verifier.score(task, FinalState(answer, tmp_path, Termination.ANSWERED))["outcome"]
        # A policy that answers at once with a plausible number from the question, no tool.
        numbers = [int(w) for w in task.prompt[-1].content.replace(".", " ").split() if w.isdigit()]
        guess = str(max(numbers))
        guessed += verifier.score(task, FinalState(guess, tmp_path, Termination.ANSWERED))["outcome"]
    assert solved == len(tasks)
    assert guessed == 0.0
