"""An eval point: one policy version measured on one frozen suite, every figure with its 95% interval.

The suite's tasks run through the same rollout runner as training (same env versions, limits and
records), as `eval` rollouts whose seeds do not depend on the step: every eval point of a run draws
with the same seeds, so two points differ only by the weights they measured (a paired comparison).
Success is averaged per task first, and the interval is a bootstrap over tasks, so repeated samples
of one task are not counted as independent evidence.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from reprorl.evaluation.stats import Estimate, mean_ci
from reprorl.hashing import derive_seed
from reprorl.rollout.runner import RolloutResult, RolloutRunner, plan_groups
from reprorl.types import Task, Termination, ToolOutcome, Trajectory

EVAL_KIND = "eval"
# The model's own mistakes in calling tools (not the tools' or the infrastructure's failures).
INVALID = frozenset(
    {
        ToolOutcome.PARSE_ERROR,
        ToolOutcome.UNKNOWN_TOOL,
        ToolOutcome.BAD_ARGUMENTS,
        ToolOutcome.PERMISSION_DENIED,
    }
)


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

    @property
    def trajectories(self) -> list[Trajectory]:
        return self.result.trajectories

    def metrics(self) -> dict[str, float]:
        """Flat figures for `metrics.jsonl`, keyed `eval/<suite>/<name>`."""
        finals = self.trajectories
        count = max(len(finals), 1)
        values = {
            "success": self.success.value,
            "success_low": self.success.low,
            "success_high": self.success.high,
            "reward": self.reward.value,
            "tasks": float(len(self.per_task)),
            "rollouts": float(len(finals)),
            "tool_calls_mean": sum(len(turn.tool_calls) for t in finals for turn in t.turns) / count,
            "invalid_calls_mean": sum(o in INVALID for t in finals for o in t.tool_outcomes()) / count,
            "infra_failures": float(sum(t.termination is Termination.INFRA_ERROR for t in finals)),
            "completion_tokens_mean": sum(t.completion_tokens for t in finals) / count,
        }
        return {f"eval/{self.suite}/{k}": v for k, v in values.items()}


def _success(t: Trajectory) -> float:
    return 1.0 if t.reward is not None and t.reward.total >= 1.0 else 0.0


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
) -> EvalPoint:
    """Run `samples_per_task` rollouts of every task of `suite` and summarise them with intervals."""
    if not tasks:
        raise ValueError(f"eval suite {suite} has no eval or holdout tasks")
    jobs = plan_groups(
        tasks,
        samples_per_task,
        run_id=run_id,
        run_seed=run_seed,
        step=step,
        kind=f"{EVAL_KIND}-{suite}",
        seed_step=0,
    )
    result = await runner.run(jobs)
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in result.trajectories:
        by_task[t.task_id].append(t)
    per_task = {task: statistics.fmean(_success(t) for t in ts) for task, ts in sorted(by_task.items())}
    rewards = {
        task: statistics.fmean(t.reward.total if t.reward else 0.0 for t in ts)
        for task, ts in sorted(by_task.items())
    }
    seed = derive_seed(run_seed, "eval-bootstrap", suite)
    return EvalPoint(
        suite=suite,
        step=step,
        policy_version=policy_version,
        result=result,
        success=mean_ci(list(per_task.values()), seed=seed),
        reward=mean_ci(list(rewards.values()), seed=seed),
        per_task=per_task,
    )
