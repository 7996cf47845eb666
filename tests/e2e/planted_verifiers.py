"""Verifiers planted with known weaknesses, for the reward-audit and screening tests (importable by the
verifier processes, so they live in a module rather than a test body)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
class Alternating(Verifier):
    """Ignores the episode: passes on every other call, counted in a file shared by its processes, so
    two consecutive scorings of the same trajectory always disagree."""

    counter: str

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        import fcntl

        with Path(self.counter).open("a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.seek(0)
            count = len(handle.read())
            handle.write(".")
        return {self.name: float(count % 2)}
