"""The run's budget: what it has spent (USD, sampled tokens, wall-clock seconds) against `budget`'s caps.

Every rollout's `cost_usd` (priced with `budget.prices`) and sampled tokens count, train and eval,
retried attempts included, plus the updates' CPU time priced at `cpu_usd_per_hour`; wall-clock
seconds are the time the loop spent in rollouts, updates and eval points. The loop checks the caps
before each step and eval point, so the run stops once it has spent a cap (the step that crossed it
is kept), as `stopped`, with a `stopped_by_rule` event naming the field. A resumed run counts what
its record holds, so it stops where an unbroken run would have.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from reprorl.config.spec import BudgetSpec
from reprorl.store import RunRecord
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import Trajectory

TIME_KEYS = ("rollout_s", "train_s", "eval_s")


class BudgetMeter:
    """Spending so far, and which cap (if any) it has reached."""

    def __init__(self, budget: BudgetSpec) -> None:
        self.budget = budget
        self.usd = 0.0
        self.tokens = 0
        self.wall_s = 0.0

    @classmethod
    def of_record(cls, budget: BudgetSpec, record: RunRecord) -> BudgetMeter:
        """The spending a (resumed) run's record holds: its stored rollouts and its timed metric lines."""
        meter = cls(budget)
        rows = RolloutStore(record).query(columns=["cost_usd", "completion_tokens"]).to_pylist()
        meter.usd = math.fsum(float(r["cost_usd"] or 0.0) for r in rows)
        meter.tokens = sum(int(r["completion_tokens"] or 0) for r in rows)
        for line in record.metrics().records:
            meter.wall_s += sum(float(line.get(k) or 0.0) for k in TIME_KEYS)
            meter.usd += float(line.get("train_cpu_s") or 0.0) * budget.prices.cpu_usd_per_hour / 3600.0
        return meter

    def spend(self, trajectories: Iterable[Trajectory], timing: dict[str, float]) -> None:
        for t in trajectories:
            self.usd += t.cost_usd
            self.tokens += t.completion_tokens
        self.wall_s += sum(timing.get(k, 0.0) for k in TIME_KEYS)
        self.usd += timing.get("train_cpu_s", 0.0) * self.budget.prices.cpu_usd_per_hour / 3600.0

    def reached(self) -> tuple[str, str] | None:
        """`(field, why)` of the first cap spent, or None."""
        caps = (
            ("budget.max_usd", self.budget.max_usd, self.usd, "${:.4f}"),
            ("budget.max_tokens", self.budget.max_tokens, self.tokens, "{:d} sampled tokens"),
            ("budget.max_wall_s", self.budget.max_wall_s, self.wall_s, "{:.1f} s"),
        )
        for field, cap, spent, shown in caps:
            if cap is not None and spent >= cap:
                return field, f"{field}: the run has spent {shown.format(spent)} of its cap {cap:g}"
        return None

    def figures(self) -> dict[str, float]:
        return {"usd": self.usd, "tokens": float(self.tokens), "wall_s": self.wall_s}
