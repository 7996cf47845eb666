"""Rollback rules in the loop: each eval point checked, the last good weights kept, stop or revert done.

At every eval point the spec's rules (`evaluation.rollback`) see the suites' figures, the train
rewards and contradicted-reward shares since the last point, the run's cost so far and the unsafe
actions since the last point.
Every check is a `guard_check` event with the evidence of each rule that fired. A point that passes
every rule leaves a good-weights checkpoint; `revert` loads the newest one (the run goes on from
there with the step counter where it was, so it meets new tasks rather than the same ones again);
`stop` ends the run as `stopped`. A revert with no good weights to go back to stops instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reprorl.config import RunSpec
from reprorl.evaluation.guards import Guard, GuardVerdict, guard_point, required_task_ids, unsafe_count
from reprorl.evaluation.point import EvalPoint
from reprorl.rollout.runner import RolloutResult
from reprorl.store import RunRecord

GUARD_FILE = "guard.json"


class LoopGuard:
    """The guard of one run and the running figures it reads: train rewards, cost, unsafe actions."""

    def __init__(self, spec: RunSpec, required: dict[str, Sequence[Any]]) -> None:
        self.guard = Guard(spec.evaluation.rollback, max_usd=spec.budget.max_usd)
        self.required = {suite: required_task_ids(tasks) for suite, tasks in required.items()}
        self.train_reward: dict[int, float] = {}
        self.train_contradicted: dict[int, float] = {}  # steps whose `integrity/contradicted` is defined
        self.cost_usd = 0.0
        self.unsafe_since_check = 0

    def after_step(
        self, step: int, result: RolloutResult, reward_mean: float, contradicted: float | None = None
    ) -> None:
        self.train_reward[step] = reward_mean
        if contradicted is not None:
            self.train_contradicted[step] = contradicted
        self.cost_usd += sum(t.cost_usd for t in result.all())
        self.unsafe_since_check += unsafe_count(result.trajectories)

    def check(self, record: RunRecord, step: int, points: Sequence[EvalPoint]) -> GuardVerdict:
        """Check the rules at an eval point and record the verdict (with each firing's evidence)."""
        self.cost_usd += sum(t.cost_usd for p in points for t in p.result.all())
        verdict = self.guard.check(
            [guard_point(p, self.required.get(p.suite, frozenset())) for p in points],
            train_reward=self.train_reward,
            cost_usd=self.cost_usd,
            train_unsafe_actions=self.unsafe_since_check,
            train_contradicted=self.train_contradicted,
        )
        self.unsafe_since_check = 0
        self.train_reward = {s: r for s, r in self.train_reward.items() if s >= step}
        self.train_contradicted = {s: r for s, r in self.train_contradicted.items() if s >= step}
        record.event("guard_check", **verdict.to_json())
        return verdict

    def save(self, folder: Path) -> None:
        state = {
            "guard": self.guard.state_dict(),
            "train_reward": {str(s): r for s, r in sorted(self.train_reward.items())},
            "train_contradicted": {str(s): r for s, r in sorted(self.train_contradicted.items())},
            "cost_usd": self.cost_usd,
            "unsafe_since_check": self.unsafe_since_check,
        }
        (folder / GUARD_FILE).write_text(json.dumps(state, sort_keys=True) + "\n")

    def load(self, folder: Path) -> None:
        state = json.loads((folder / GUARD_FILE).read_text())
        self.guard.load_state_dict(state["guard"])
        self.train_reward = {int(s): float(r) for s, r in state["train_reward"].items()}
        # Checkpoints from before the integrity figures have none to restore.
        contradicted = state.get("train_contradicted", {})
        self.train_contradicted = {int(s): float(r) for s, r in contradicted.items()}
        self.cost_usd = float(state["cost_usd"])
        self.unsafe_since_check = int(state["unsafe_since_check"])
