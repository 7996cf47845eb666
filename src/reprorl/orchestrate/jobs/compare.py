"""Comparing two runs on one frozen suite: same suite version, same tasks, a paired difference.

Each run's last eval point on the suite is read from its stored eval rollouts. Numbers measured on
different versions of a suite are not comparable (the tasks differ), so a comparison across versions
is refused with the reason, unless both are asked for: then each run is reported on its own version
and no difference is computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reprorl.errors import UserInputError
from reprorl.evaluation.metrics import task_interval
from reprorl.evaluation.stats import Estimate, PairedDifference, paired_difference
from reprorl.hashing import derive_seed
from reprorl.orchestrate.run.outcome import per_task_success
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore


@dataclass(frozen=True)
class RunOnSuite:
    """One run's last eval point on a suite: the exact version, its step and weights, success per task."""

    run_id: str
    suite: str  # name@sha256:… as the run pinned it
    version: str  # the registry's label, e.g. calc-eval@v2
    step: int
    policy_version: str
    per_task: dict[str, float]
    success: Estimate

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "suite": self.suite,
            "version": self.version,
            "step": self.step,
            "policy_version": self.policy_version,
            "tasks": len(self.per_task),
            "success": self.success.value,
            "success_low": self.success.low,
            "success_high": self.success.high,
        }


@dataclass(frozen=True)
class Comparison:
    a: RunOnSuite
    b: RunOnSuite
    difference: PairedDifference | None  # b - a; None when the versions differ

    @property
    def comparable(self) -> bool:
        return self.difference is not None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"a": self.a.to_json(), "b": self.b.to_json(), "comparable": self.comparable}
        if self.difference is not None:
            d = self.difference
            out["difference"] = {
                "b_minus_a": d.estimate.value,
                "low": d.estimate.low,
                "high": d.estimate.high,
                "p_value": d.p_value,
            }
        return out


def _on_suite(store: Store, record: RunRecord, name: str) -> RunOnSuite:
    evals = [m for m in record.metrics().records if m.get("stage") == "eval"]
    mine = [m for m in evals if str(m.get("suite", "")).split("@")[0] == name]
    if not mine:
        seen = sorted({str(m.get("suite")) for m in evals}) or ["none"]
        raise UserInputError(
            f"run {record.run_id} has no eval point on suite {name} (it was evaluated on: {', '.join(seen)})",
            field="--suite",
        )
    last = mine[-1]
    ref, step = str(last["suite"]), int(last["step"])
    version = store.resolve(ref).version
    rows = (
        RolloutStore(record)
        .query(
            f"step = {step} AND (split = 'eval' OR split = 'holdout') AND group_id LIKE '%/eval-{name}/%'",
            columns=["task_id", "reward_total", "reward_components"],
        )
        .to_pylist()
    )
    per_task = per_task_success(rows)
    seed = derive_seed(0, "compare", ref)
    return RunOnSuite(
        run_id=record.run_id,
        suite=ref,
        version=f"{version.name}@v{version.version}" if version else ref,
        step=step,
        policy_version=str(last.get("policy_version", "")),
        per_task=per_task,
        success=task_interval(per_task, seed),
    )


def compare_runs(store: Store, a: RunRecord, b: RunRecord, suite: str, *, both: bool = False) -> Comparison:
    """Run `b` against run `a` on `suite` (NAME or NAME@VERSION): a paired difference on the same tasks."""
    name = suite.split("@")[0]
    first, second = _on_suite(store, a, name), _on_suite(store, b, name)
    wanted = store.resolve(suite).hash if "@" in suite else None
    for run in (first, second):
        got = store.resolve(run.suite).hash
        if wanted is not None and got != wanted and not both:
            raise UserInputError(
                f"run {run.run_id} was evaluated on {run.version}, not {suite}; figures from different "
                "suite versions are not comparable (pass --both to report each on its own version)",
                field="--suite",
            )
    same = store.resolve(first.suite).hash == store.resolve(second.suite).hash
    if not same and not both:
        raise UserInputError(
            f"run {a.run_id} was evaluated on {first.version} and run {b.run_id} on {second.version}; "
            "figures from different suite versions are not comparable (--both reports each on its own)",
            field="--suite",
        )
    difference = None
    if same:
        seed = derive_seed(0, "compare", first.suite)
        difference = paired_difference(second.per_task, first.per_task, seed=seed)
    return Comparison(first, second, difference)
