"""Numeric answers: the last number in the agent's final answer must equal the reference."""

from __future__ import annotations

import re
from dataclasses import dataclass

from reprorl.rewards.base import FinalState, Verifier
from reprorl.rewards.registered import register_verifier
from reprorl.types import Task

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


@register_verifier("numeric")
@dataclass(frozen=True)
class NumericAnswer(Verifier):
    """1.0 when the final answer's last number matches `reference['answer']`, else 0.0."""

    abs_tol: float = 1e-6
    """How far the answer may be from the reference: the calc tool prints six decimals. An absolute
    bound, not a relative one: a relative tolerance on a large count accepts answers that are off
    by one or more."""

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        assert isinstance(task.reference, dict), "numeric tasks carry {'answer': number}"
        expected = float(task.reference["answer"])  # type: ignore[arg-type]
        given = last_number(state.answer or "")
        correct = given is not None and abs(given - expected) <= self.abs_tol
        return {self.name: 1.0 if correct else 0.0}
