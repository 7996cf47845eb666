"""The faults `bench/faults.py` injects, registered by name, and the figures each trial yields.

A fault is a function `(bench, trials, rng) -> list[Trial]` registered with `@fault(name, what)`;
`bench/faults.py` imports the modules of this package, runs the faults asked for and prints one row
per fault. The tests in `tests/faults/` run each one with a trial or two.
"""

from __future__ import annotations

import importlib
import pkgutil
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from faultlib.harness import Bench

__all__ = ["FAULTS", "Fault", "Row", "Trial", "fault", "load_faults", "summarise"]


@dataclass(frozen=True)
class Trial:
    """One injection of a fault into one run, and how the run came out of it."""

    finished: bool  # the run (after its resume, where one was needed) ended succeeded
    identical: bool  # ... with every metric, sampled token, reward and the adapter of the reference
    lost: int  # records of the reference run missing from this one (rollouts and metric lines)
    recover_s: float | None  # from the fault to the run's next record of progress
    notes: tuple[str, ...] = ()
    same_tokens: bool = False  # every rollout with the reference's sampled tokens, reward and end


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    run: Callable[[Bench, int, random.Random], list[Trial]]


FAULTS: dict[str, Fault] = {}


def fault(name: str, what: str) -> Callable[[Callable[..., list[Trial]]], Callable[..., list[Trial]]]:
    """Register a fault under `name`; `what` is the line the table prints for it."""

    def register(fn: Callable[..., list[Trial]]) -> Callable[..., list[Trial]]:
        if name in FAULTS:
            raise ValueError(f"fault {name!r} is registered twice")
        FAULTS[name] = Fault(name, what, fn)
        return fn

    return register


@dataclass(frozen=True)
class Row:
    fault: str
    trials: int
    finished: int
    identical: int
    same_tokens: int
    lost: int
    recover_median_s: float | None
    recover_max_s: float | None
    notes: dict[str, int] = field(default_factory=dict)


def summarise(name: str, trials: list[Trial]) -> Row:
    recovered = [t.recover_s for t in trials if t.recover_s is not None]
    notes: dict[str, int] = {}
    for trial in trials:
        for note in trial.notes:
            notes[note] = notes.get(note, 0) + 1
    return Row(
        fault=name,
        trials=len(trials),
        finished=sum(t.finished for t in trials),
        identical=sum(t.identical for t in trials),
        same_tokens=sum(t.same_tokens for t in trials),
        lost=sum(t.lost for t in trials),
        recover_median_s=statistics.median(recovered) if recovered else None,
        recover_max_s=max(recovered) if recovered else None,
        notes=notes,
    )


def load_faults() -> dict[str, Fault]:
    """Import every module of this package, so each registers its faults; returns them all."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return FAULTS
