"""Verifiers planted with known weaknesses, for the reward-audit and screening tests (importable by the
verifier processes, so they live in a module rather than a test body)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from reprorl.rewards import FinalState, Verifier
from reprorl.types import Task


@dataclass(frozen=True)
class DigitsAnywhere(Verifier):
    """Passes any answer that contains the right number's digits anywhere in it."""

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        assert isinstance(task.reference, dict)
        expected = str(task.reference["answer"]).removesuffix(".0")
        return {self.name: float(expected in (state.answer or ""))}


@dataclass(frozen=True)
class CoinFlip(Verifier):
    """Ignores the episode and flips a coin: disagrees with itself on the same trajectory."""

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        return {self.name: float(random.SystemRandom().random() < 0.5)}
