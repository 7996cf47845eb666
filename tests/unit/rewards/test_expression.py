"""`ExpressionAnswer`: recomputes the calculator's answer on its own and agrees with `NumericAnswer` on
honest answers, while refusing sloppy ones the primary lets through."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprorl.envs.families.calculator import evaluate
from reprorl.rewards import FinalState
from reprorl.rewards.verifiers.expression import ExpressionAnswer, arithmetic, stated_number
from reprorl.rewards.verifiers.numeric import NumericAnswer
from reprorl.rollout.families import FAMILIES
from reprorl.types import Split, Task, Termination


def _score(verifier: ExpressionAnswer | NumericAnswer, task: Task, answer: str, tmp_path: Path) -> float:
    return verifier.score(task, FinalState(answer, tmp_path, Termination.ANSWERED))[verifier.name]


def test_its_arithmetic_matches_the_env_on_every_story() -> None:
    tasks = FAMILIES["calculator"].generate(5, train=40, eval=20, holdout=20)
    for task in (t for split in tasks.values() for t in split.tasks):
        assert isinstance(task.reference, dict)
        expression = str(task.reference["expression"])
        assert arithmetic(expression) == evaluate(expression) == task.reference["answer"]
    for bad in ("__import__('os')", "2 ** 100", "abs(3)", "True + 1", "x"):
        with pytest.raises(ValueError):
            arithmetic(bad)


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("3944", 3944.0),
        ("-2059", -2059.0),
        ("The answer is 3,944.", 3944.0),
        ("929 - 89 + 97 * 32 = 3944", 3944.0),
        ("Result: 12.5", 12.5),
        ("3941 or 3944", None),  # two candidates, neither stated as the answer
        ("1,2", None),  # not a thousands separator: two numbers
        ("no number", None),
    ],
)
def test_the_stated_number(text: str, number: float | None) -> None:
    assert stated_number(text) == number


def test_agrees_on_honest_answers_and_disagrees_on_sloppy_ones(tmp_path: Path) -> None:
    task = FAMILIES["calculator"].generate(0, train=0, eval=1, holdout=0)[Split.EVAL].tasks[0]
    assert isinstance(task.reference, dict)
    answer = task.reference["answer"]
    assert isinstance(answer, int)
    primary, cross = NumericAnswer(), ExpressionAnswer()
    for honest in (str(answer), f"The answer is {answer:,}.", f"{task.reference['expression']} = {answer}"):
        assert _score(primary, task, honest, tmp_path) == _score(cross, task, honest, tmp_path) == 1.0
    for wrong in (str(answer + 1), "", "Done."):
        assert _score(primary, task, wrong, tmp_path) == _score(cross, task, wrong, tmp_path) == 0.0
    sloppy = f"{answer - 1} or {answer}"  # the primary reads only the last number
    assert (_score(primary, task, sloppy, tmp_path), _score(cross, task, sloppy, tmp_path)) == (1.0, 0.0)
