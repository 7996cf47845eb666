"""A run's outcome on its eval suites: success at the first and last eval points, and their paired difference.

Read from the stored eval rollouts, so it is the same for a run that was killed and resumed, and
for anyone reading the records later. Every eval point of a run draws with the same seeds, so the
first and last points are compared task by task (a paired difference with its interval and p-value).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from reprorl.evaluation.metrics import task_interval
from reprorl.evaluation.stats import Estimate, PairedDifference, paired_difference
from reprorl.hashing import derive_seed
from reprorl.store import RunRecord
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import outcome_success


@dataclass(frozen=True)
class SuiteOutcome:
    suite: str
    first_step: int
    last_step: int
    before: Estimate
    after: Estimate
    change: PairedDifference


def per_task_success(rows: list[dict[str, object]]) -> dict[str, float]:
    """Mean success per task id of stored rollout rows (task_id, reward_total, reward_components)."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        total, components = row["reward_total"], row["reward_components"]
        done = isinstance(total, float) and outcome_success(total, dict(components or []))  # type: ignore[call-overload]
        by_task[str(row["task_id"])].append(1.0 if done else 0.0)
    return {task: statistics.fmean(values) for task, values in sorted(by_task.items())}


def suite_points(record: RunRecord) -> dict[str, dict[int, dict[str, float]]]:
    """Per eval suite, per eval step: each task's mean success, from the stored eval rollouts."""
    table = RolloutStore(record).query(
        "split = 'eval' OR split = 'holdout'",
        columns=["group_id", "step", "task_id", "reward_total", "reward_components"],
    )
    rows: dict[tuple[str, int], list[dict[str, object]]] = defaultdict(list)
    for row in table.to_pylist():
        # group ids read <run_id>/eval-<suite>/<step>/<task_id>
        kind = str(row["group_id"]).split("/")[1]
        rows[(kind.removeprefix("eval-"), int(row["step"]))].append(row)
    points: dict[str, dict[int, dict[str, float]]] = defaultdict(dict)
    for (suite, step), found in sorted(rows.items()):
        points[suite][step] = per_task_success(found)
    return dict(points)


def eval_outcomes(record: RunRecord, seed: int = 0) -> list[SuiteOutcome]:
    """Per eval suite: success before (first eval point) and after (last), with 95% intervals."""
    outcomes = []
    for suite, by_step in sorted(suite_points(record).items()):
        steps = sorted(by_step)
        first, last = by_step[steps[0]], by_step[steps[-1]]
        boot = derive_seed(seed, "outcome", suite)
        outcomes.append(
            SuiteOutcome(
                suite=suite,
                first_step=steps[0],
                last_step=steps[-1],
                before=task_interval(first, boot),
                after=task_interval(last, boot),
                change=paired_difference(last, first, seed=boot),
            )
        )
    return outcomes
