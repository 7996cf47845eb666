"""What the rollback rules see: each suite's eval point, the history kept of checked steps, and the
observation of the step being checked (`guards.py` builds them; `guard_rules.py` reads them)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GuardPoint:
    """One suite's eval point as the guards see it: success overall and per task, tool and safety counts."""

    step: int
    suite: str
    success: float
    per_task: Mapping[str, float] = field(default_factory=dict)
    required: frozenset[str] = frozenset()  # ids of the suite's tasks tagged `required`
    tool_calls: int = 0
    tool_failures: int = 0  # calls that failed through no fault of the model (TOOL_FAULTS)
    unsafe_actions: int = 0  # eval rollouts that ended with Termination.UNSAFE_ACTION
    metrics: Mapping[str, float] = field(default_factory=dict)  # short names: "reward", "tokens", ...

    def __post_init__(self) -> None:
        if min(self.tool_calls, self.tool_failures, self.unsafe_actions) < 0:
            raise ValueError(f"{self.suite}@{self.step}: counts must not be negative")
        if self.tool_failures > self.tool_calls:
            raise ValueError(f"{self.suite}@{self.step}: {self.tool_failures} tool failures > calls")

    def required_success(self) -> dict[str, float]:
        """Success of each required task this point measured."""
        return {t: float(self.per_task[t]) for t in sorted(self.required) if t in self.per_task}


@dataclass(frozen=True)
class GuardRecord:
    """What the history keeps of one checked eval step: what the rules that look back need."""

    step: int
    held_out: float  # mean success over the step's suites, each suite weighted equally
    required: Mapping[str, Mapping[str, float]]  # suite -> required task id -> success
    train: tuple[tuple[int, float], ...]  # (step, mean train reward) of the steps this point measured
    passed: bool

    def to_json(self) -> dict[str, Any]:
        train = [list(pair) for pair in self.train]
        required = {s: dict(v) for s, v in self.required.items()}
        return {
            "step": self.step,
            "held_out": self.held_out,
            "required": required,
            "train": train,
            "passed": self.passed,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GuardRecord:
        return cls(
            step=int(data["step"]),
            held_out=float(data["held_out"]),
            required={s: {t: float(v) for t, v in ts.items()} for s, ts in data["required"].items()},
            train=tuple((int(step), float(reward)) for step, reward in data["train"]),
            passed=bool(data["passed"]),
        )


@dataclass(frozen=True)
class Observation:
    """Everything known at the step being checked, besides the history before it."""

    step: int
    points: tuple[GuardPoint, ...]
    train: tuple[tuple[int, float], ...]
    cost_usd: float
    train_unsafe_actions: int
    # (step, share of rewarded train rollouts contradicted) of the steps this point measured
    train_contradicted: tuple[tuple[int, float], ...] = ()

    @property
    def held_out(self) -> float:
        return statistics.fmean(p.success for p in self.points)
