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


@dataclass(frozen=True)
class HangsOnThreeInFive(Verifier):
    """Scores train-split episodes like the calculator's verifier, but hangs on three of every five
    (the first, second and third of each five episodes it is asked about, counted in a shared file,
    an episode asked about again keeping its first verdict); eval episodes are scored normally."""

    ledger: str
    hang_s: float = 30.0

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        import fcntl
        import time

        from reprorl.rewards.verifiers.numeric import NumericAnswer

        if task.split == "train":
            with Path(self.ledger).open("a+") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                handle.seek(0)
                seen = handle.read().split()
                key = str(state.workdir)
                if key not in seen:
                    handle.write(key + "\n")
                    seen.append(key)
                hangs = seen.index(key) % 5 < 3
            if hangs:
                time.sleep(self.hang_s)
        return NumericAnswer().score(task, state)
