"""An eval point: one policy version measured on one frozen suite, every figure with its 95% interval.

The suite's tasks run through the same rollout runner as training (same env versions, limits and
records), as `eval` rollouts whose seeds do not depend on the step: every eval point of a run draws
with the same seeds, so two points differ only by the weights they measured (a paired comparison).
Success is averaged per task first and the interval is over tasks (Wilson when each task simply
passed or failed, else a bootstrap), so repeated samples of one task are not counted as
independent evidence. The point keeps the suite's tasks, so its
figures (`reprorl.evaluation.metrics`) can be split by env family and compared with reference steps.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from reprorl.evaluation.acceptance import acceptance
from reprorl.evaluation.metrics import INVALID as INVALID  # re-exported: the guards' tests use it
from reprorl.evaluation.metrics import reward_total, suite_metrics, task_interval
from reprorl.evaluation.metrics import success as _success
from reprorl.evaluation.stats import Estimate
from reprorl.hashing import derive_seed
from reprorl.rollout.runner import RolloutResult, RolloutRunner, plan_groups
from reprorl.rollout.scoring import counted
from reprorl.types import Task, Trajectory

EVAL_KIND = "eval"


@dataclass(frozen=True)
class EvalPoint:
    """What one eval measured: the suite, the weights, the rollouts, and the figures."""

    suite: str
    step: int
    policy_version: str
    result: RolloutResult
    success: Estimate
    reward: Estimate
    per_task: dict[str, float]  # task id → mean success over its samples
    # The suite's tasks by id (families, reference steps); a point built without them reports one family.
    tasks: Mapping[str, Task] = field(default_factory=dict, repr=False)
    seed: int = 0  # of the bootstrap intervals `metrics()` adds (partial credit, extra steps, families)
    thresholds: Mapping[str, float] = field(default_factory=dict)  # the spec's acceptance thresholds

    @property
    def trajectories(self) -> list[Trajectory]:
        return self.result.trajectories

    def metrics(self) -> dict[str, float]:
        """Flat figures for `metrics.jsonl`, keyed `eval/<suite>/<name>` (and `eval/<suite>/<family>/<name>`).

        What each name means is in `reprorl.evaluation.metrics`.
        """
        values = suite_metrics(
            self.trajectories,
            self.per_task,
            self.tasks,
            success_estimate=self.success,
            reward=self.reward.value,
            seed=self.seed,
        )
        values |= acceptance(self.thresholds, values)
        return {f"eval/{self.suite}/{k}": v for k, v in values.items()}


def bootstrap_seed(run_seed: int, suite: str) -> int:
    """The seed of a suite's bootstrap intervals: one per run and suite, so every point resamples alike."""
    return derive_seed(run_seed, "eval-bootstrap", suite)


async def evaluate(
    runner: RolloutRunner,
    suite: str,
    tasks: Sequence[Task],
    *,
    run_id: str,
    run_seed: int,
    step: int,
    policy_version: str,
    samples_per_task: int = 1,
    thresholds: Mapping[str, float] | None = None,
    temperature: float | None = None,
) -> EvalPoint:
    """Run `samples_per_task` rollouts of every task of `suite` and summarise them with intervals;
    `temperature` (`evaluation.temperature`) replaces the runner's for these rollouts."""
    if not tasks:
        raise ValueError(f"eval suite {suite} has no eval or holdout tasks")
    params = None if temperature is None else runner.params.model_copy(update={"temperature": temperature})
    jobs = plan_groups(
        tasks,
        samples_per_task,
        run_id=run_id,
        run_seed=run_seed,
        step=step,
        kind=f"{EVAL_KIND}-{suite}",
        seed_step=0,
    )
    result = await runner.run([dataclasses.replace(job, params=params) for job in jobs])
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in counted(result.trajectories):  # a task none of whose samples counts has no score here
        by_task[t.task_id].append(t)
    per_task = {task: statistics.fmean(_success(t) for t in ts) for task, ts in sorted(by_task.items())}
    rewards = {task: statistics.fmean(reward_total(t) for t in ts) for task, ts in sorted(by_task.items())}
    seed = bootstrap_seed(run_seed, suite)
    return EvalPoint(
        suite=suite,
        step=step,
        policy_version=policy_version,
        result=result,
        success=task_interval(per_task, seed),
        reward=task_interval(rewards, seed),
        per_task=per_task,
        tasks={t.id: t for t in tasks},
        seed=seed,
        thresholds=dict(thresholds or {}),
    )
