"""Suite deltas: two runs' last eval points on each suite, paired when they measured the same thing.

Each side's figures come from its metrics log and its eval rollouts; the paired difference (B - A,
with interval and p-value) comes from `orchestrate.compare`. Two points are comparable only on the
same suite version and the same splits; otherwise each side is shown on its own and the reason is
kept, so nobody reads a difference between different task sets as progress.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from reprorl.errors import ReprorlError
from reprorl.evaluation.stats import PairedDifference
from reprorl.orchestrate.jobs.compare import compare_runs
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore


@dataclass(frozen=True)
class SuiteSide:
    """One run's last eval point on a suite, as its metrics log and eval rollouts record it."""

    suite: str  # name@sha256:… as the run pinned it
    version: str  # the registry's label, e.g. calc-eval@v2
    step: int
    splits: tuple[str, ...]
    tasks: int
    figures: dict[str, float]

    def figure(self, name: str) -> float:
        return self.figures.get(name, math.nan)

    def to_json(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "version": self.version,
            "step": self.step,
            "splits": list(self.splits),
            "tasks": self.tasks,
            "success": _num(self.figure("success")),
            "success_low": _num(self.figure("success_low")),
            "success_high": _num(self.figure("success_high")),
            "figures": {k: _num(v) for k, v in sorted(self.figures.items())},
        }


@dataclass(frozen=True)
class SuiteDelta:
    """A suite either run was evaluated on: each side's figures and, when comparable, B - A paired."""

    suite: str
    a: SuiteSide | None
    b: SuiteSide | None
    difference: PairedDifference | None = None
    reason: str | None = None  # why the two cannot be compared; None when they can

    @property
    def comparable(self) -> bool:
        return self.reason is None

    def deltas(self) -> dict[str, float]:
        """B - A of every figure both last eval points report (only when comparable)."""
        if not self.comparable or self.a is None or self.b is None:
            return {}
        shared = self.a.figures.keys() & self.b.figures.keys()
        return {k: self.b.figures[k] - self.a.figures[k] for k in sorted(shared)}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "suite": self.suite,
            "comparable": self.comparable,
            "reason": self.reason,
            "a": self.a.to_json() if self.a else None,
            "b": self.b.to_json() if self.b else None,
            "difference": None,
            "deltas": {k: _num(v) for k, v in self.deltas().items()},
        }
        if self.difference is not None:
            d = self.difference
            out["difference"] = {
                "b_minus_a": _num(d.estimate.value),
                "low": _num(d.estimate.low),
                "high": _num(d.estimate.high),
                "p_value": _num(d.p_value),
                "tasks": d.estimate.n,
            }
        return out


def suite_deltas(store: Store, a: RunRecord, b: RunRecord) -> tuple[SuiteDelta, ...]:
    """Per suite either run was evaluated on: its last eval point on each side, paired when comparable."""
    points_a, points_b = _last_eval_points(a), _last_eval_points(b)
    out = []
    for name in sorted(points_a.keys() | points_b.keys()):
        side_a = _side(store, a, name, points_a[name]) if name in points_a else None
        side_b = _side(store, b, name, points_b[name]) if name in points_b else None
        out.append(_pair(store, a, b, name, side_a, side_b))
    return tuple(out)


def _pair(
    store: Store, a: RunRecord, b: RunRecord, name: str, side_a: SuiteSide | None, side_b: SuiteSide | None
) -> SuiteDelta:
    if side_a is None or side_b is None:
        return SuiteDelta(
            name, side_a, side_b, reason=f"only run {'A' if side_a else 'B'} was evaluated on it"
        )
    if side_a.suite.rpartition("@")[2] != side_b.suite.rpartition("@")[2]:  # both pinned: compare hashes
        why = f"different suite versions: {side_a.version} vs {side_b.version}"
        return SuiteDelta(name, side_a, side_b, reason=why)
    if side_a.splits != side_b.splits:
        why = f"different splits: {'+'.join(side_a.splits)} vs {'+'.join(side_b.splits)}"
        return SuiteDelta(name, side_a, side_b, reason=why)
    try:
        comparison = compare_runs(store, a, b, side_a.suite)
    except (ReprorlError, ValueError) as exc:  # e.g. the two points covered different tasks
        return SuiteDelta(name, side_a, side_b, reason=str(exc))
    return SuiteDelta(name, side_a, side_b, comparison.difference)


def _last_eval_points(record: RunRecord) -> dict[str, dict[str, Any]]:
    last: dict[str, dict[str, Any]] = {}
    for point in record.metrics().records:
        if point.get("stage") == "eval" and point.get("suite"):
            last[str(point["suite"]).split("@")[0]] = point
    return last


def _side(store: Store, record: RunRecord, name: str, point: dict[str, Any]) -> SuiteSide:
    ref, step = str(point["suite"]), int(point["step"])
    prefix = f"eval/{name}/"
    figures = {
        key[len(prefix) :]: float(value)
        for key, value in point.items()
        if key.startswith(prefix) and "/" not in key[len(prefix) :] and isinstance(value, int | float)
    }
    rows = (
        RolloutStore(record)
        .query(f"step = {step} AND split IN ('eval', 'holdout')", columns=["group_id", "split", "task_id"])
        .to_pylist()
    )
    # group ids read <run_id>/eval-<suite>/<step>/<task_id>
    mine = [r for r in rows if str(r["group_id"]).split("/")[1:2] == [f"eval-{name}"]]
    try:
        version = store.resolve(ref).version
    except ReprorlError:
        version = None
    return SuiteSide(
        suite=ref,
        version=version.label if version else ref,
        step=step,
        splits=tuple(sorted({str(r["split"]) for r in mine})),
        tasks=len({r["task_id"] for r in mine}),
        figures=figures,
    )


def _num(value: float) -> float | None:
    return None if math.isnan(value) else value
