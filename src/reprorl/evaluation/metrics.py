"""Eval metrics: the flat figures an eval point reports for a suite and for each env family in it.

Scores that come per task (success, partial credit, extra steps) are averaged over a task's samples
first and given the bootstrap-over-tasks interval, so repeated samples of one task do not count as
independent evidence. When a suite spans several env families, tasks of one family can be
correlated (same generator, same tools), so success and partial credit also get a cluster-robust
interval clustered by family, and every figure is repeated per family as `<family>/<name>`.
Counts and rates over episodes or tool calls (latency, tokens, takeovers, failures, cost) carry no
interval.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from reprorl.evaluation.stats import (
    Estimate,
    clustered_mean_ci,
    mean_ci,
    mean_pass_at_k,
    mean_pass_hat_k,
    proportion_ci,
)
from reprorl.hashing import derive_seed
from reprorl.rollout.scoring import counted, exclusion_metrics
from reprorl.rollout.stats import HUMAN_TOOL
from reprorl.types import Task, Termination, ToolOutcome, Trajectory

# The model's own mistakes in calling tools (not the tools' or the infrastructure's failures).
INVALID = frozenset(
    {
        ToolOutcome.PARSE_ERROR,
        ToolOutcome.UNKNOWN_TOOL,
        ToolOutcome.BAD_ARGUMENTS,
        ToolOutcome.PERMISSION_DENIED,
    }
)
FAILURE_CLASSES = tuple(o for o in ToolOutcome if o is not ToolOutcome.OK)
# Tasks the point was not given (an EvalPoint built without its tasks) share one family.
UNKNOWN_FAMILY = "unknown"


def success(t: Trajectory) -> float:
    """1 when the verifier says the task was done, else 0; only for rollouts that count (a rollout with
    no reward is left out by `reprorl.rollout.scoring.counted`, never scored 0)."""
    return 1.0 if t.reward is not None and t.reward.success else 0.0


def partial_credit(t: Trajectory) -> float:
    """The reward's `outcome` component (the total where the verifier gives none); 0 without a reward."""
    return t.reward.components.get("outcome", t.reward.total) if t.reward is not None else 0.0


def reward_total(t: Trajectory) -> float:
    return t.reward.total if t.reward is not None else 0.0


def tool_steps(t: Trajectory) -> int:
    """Model turns that acted through tools.

    A task's `reference_steps` counts the tool calls of its reference solution and not the closing
    answer, so the answer turn is left out here too: an episode that follows the reference exactly
    has 0 extra steps.
    """
    return sum(1 for turn in t.turns if turn.tool_calls or turn.tool_results)


def human_takeovers(t: Trajectory) -> int:
    """`ask_human` calls that reached the human (as `tools/human_takeovers` counts them)."""
    return sum(
        r.name == HUMAN_TOOL and r.outcome is ToolOutcome.OK for turn in t.turns for r in turn.tool_results
    )


def per_task_mean(
    trajectories: Iterable[Trajectory], score: Callable[[Trajectory], float]
) -> dict[str, float]:
    """Task id → mean of `score` over that task's samples, in task id order."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        by_task[t.task_id].append(score(t))
    return {task: statistics.fmean(v) for task, v in sorted(by_task.items())}


def task_interval(per_task: Mapping[str, float], seed: int) -> Estimate:
    """Mean over tasks with the 95% interval every eval point reports: Wilson when each task is a
    plain pass or fail (one sample each), else the bootstrap over tasks.

    With 0/1 values the bootstrap collapses to [0, 0] when no task passes and covers rare success
    badly on small suites (about 80% at 16 tasks and p = 0.1); Wilson covers about 95% there too.
    """
    values = list(per_task.values())
    if not values:  # every rollout was left out: there is no score, which is not a score of 0
        return Estimate(math.nan, math.nan, math.nan, 0, "none")
    if all(v in (0.0, 1.0) for v in values):
        return proportion_ci(int(sum(values)), len(values))
    return mean_ci(values, seed=seed)


def interval(name: str, estimate: Estimate) -> dict[str, float]:
    return {name: estimate.value, f"{name}_low": estimate.low, f"{name}_high": estimate.high}


def families_of(task_ids: Iterable[str], tasks: Mapping[str, Task]) -> dict[str, str]:
    """Task id → env family, for every id given."""
    return {i: tasks[i].family if i in tasks else UNKNOWN_FAMILY for i in task_ids}


def group_metrics(
    trajectories: Sequence[Trajectory],
    tasks: Mapping[str, Task],
    *,
    success_estimate: Estimate | None,
    reward: float,
    seed: int,
) -> dict[str, float]:
    """Every figure of one group of rollouts (a suite, or one family of it), keyed by short name.

        Per task, with `_low` / `_high` bootstrap bounds: `success`, `partial_credit` (the `outcome`
        component), `extra_steps` (`tool_steps` minus `reference_steps`, only over tasks with one; absent
        when none has). Per episode: `tool_calls_mean`, `invalid_calls_mean`, `completion_tokens_mean`,
        `prompt_tokens_mean`, `human_takeovers_mean`, `human_takeover_share` (episodes with at least
        one), `latency_mean` / `_p50` / `_p95` (wall seconds). Totals: `rollouts`, `tasks`,
        `infra_failures`, `unsafe_actions` (episodes ending in UNSAFE_ACTION), `cost_usd`. With k >= 2
    samples of every task, `pass_at_<k>` and `pass_hat_<k>` (unbiased, averaged over tasks). Per tool call:
        `tool_failure_rate_<class>` for every outcome class but ok. `reward`: mean total reward over tasks.
    """
    episodes, trajectories = trajectories, counted(trajectories)
    count = max(len(episodes), 1)
    values: dict[str, float] = {}
    if success_estimate is not None:
        values |= interval("success", success_estimate)
    partial = per_task_mean(trajectories, partial_credit)
    if partial:
        values |= interval("partial_credit", task_interval(partial, seed))
    values |= {
        "reward": reward,
        "tasks": float(len({t.task_id for t in trajectories})),
        "rollouts": float(len(episodes)),
        "tool_calls_mean": sum(len(turn.tool_calls) for t in episodes for turn in t.turns) / count,
        "invalid_calls_mean": sum(o in INVALID for t in episodes for o in t.tool_outcomes()) / count,
        "infra_failures": float(sum(t.termination is Termination.INFRA_ERROR for t in episodes)),
        **exclusion_metrics(episodes),
    }
    # Scores come from the rollouts that count; what episodes did and cost, from every one of them.
    values |= _extra_steps(trajectories, tasks, seed)
    values |= _pass_k(trajectories)
    values |= _latency([t.wall_s for t in episodes])
    takeovers = [human_takeovers(t) for t in episodes]
    values |= {
        "completion_tokens_mean": sum(t.completion_tokens for t in episodes) / count,
        "prompt_tokens_mean": sum(t.prompt_tokens for t in episodes) / count,
        "human_takeovers_mean": sum(takeovers) / count,
        "human_takeover_share": sum(n > 0 for n in takeovers) / count,
        "unsafe_actions": float(sum(t.termination is Termination.UNSAFE_ACTION for t in episodes)),
        "cost_usd": math.fsum(t.cost_usd for t in episodes),
    }
    outcomes = [o for t in episodes for o in t.tool_outcomes()]
    # No calls means no failed calls: 0, not NaN, so a rule or a plot never trips on a tool-free suite.
    calls = max(len(outcomes), 1)
    values |= {f"tool_failure_rate_{o.value}": sum(x is o for x in outcomes) / calls for o in FAILURE_CLASSES}
    return values


def _extra_steps(
    trajectories: Sequence[Trajectory], tasks: Mapping[str, Task], seed: int
) -> dict[str, float]:
    """Tool steps beyond the reference, over the tasks that have one; nothing when none has."""
    steps = {i: tasks[i].reference_steps for i in {t.task_id for t in trajectories} if i in tasks}
    known = [t for t in trajectories if steps.get(t.task_id) is not None]
    if not known:
        return {}
    per_task = per_task_mean(known, lambda t: float(tool_steps(t) - (steps[t.task_id] or 0)))
    return interval("extra_steps", task_interval(per_task, seed))


def _pass_k(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """With k >= 2 samples of every task: unbiased pass@k (any of k succeeds) and pass^k (all k do)."""
    counts: dict[str, list[int]] = {}
    for t in trajectories:
        n_c = counts.setdefault(t.task_id, [0, 0])
        n_c[0] += 1
        n_c[1] += int(success(t))
    k = min((n for n, _ in counts.values()), default=0)
    if k < 2:
        return {}
    pairs = {task: (n, c) for task, (n, c) in counts.items()}
    return {f"pass_at_{k}": mean_pass_at_k(pairs, k), f"pass_hat_{k}": mean_pass_hat_k(pairs, k)}


def _latency(walls: Sequence[float]) -> dict[str, float]:
    """Episode wall time: mean and linearly interpolated p50 / p95 (NaN without episodes)."""
    if not walls:
        return {"latency_mean": math.nan, "latency_p50": math.nan, "latency_p95": math.nan}
    p50, p95 = np.percentile(np.asarray(walls, dtype=np.float64), [50.0, 95.0])
    return {"latency_mean": statistics.fmean(walls), "latency_p50": float(p50), "latency_p95": float(p95)}


def suite_metrics(
    trajectories: Sequence[Trajectory],
    per_task: Mapping[str, float],
    tasks: Mapping[str, Task],
    *,
    success_estimate: Estimate,
    reward: float,
    seed: int,
) -> dict[str, float]:
    """A suite's figures by short name, plus `<family>/<name>` and cluster intervals when it spans families.

    `per_task` is the success of each task and `success_estimate` its interval, as the eval point
    stored them; `seed` is the point's bootstrap seed (each family derives its own from it).
    """
    family = families_of({*per_task, *(t.task_id for t in trajectories)}, tasks)
    values = group_metrics(trajectories, tasks, success_estimate=success_estimate, reward=reward, seed=seed)
    values["tasks"] = float(len(per_task))  # the tasks the point scored, as it has always reported
    names = sorted(set(family.values()))
    if len(names) < 2:
        return values
    partial = per_task_mean(counted(trajectories), partial_credit)
    for name, scores in (("success", per_task), ("partial_credit", partial)):
        if scores:
            cluster = clustered_mean_ci(list(scores.values()), [family[i] for i in scores])
            values |= {f"{name}_cluster_low": cluster.low, f"{name}_cluster_high": cluster.high}
    rewards = per_task_mean(counted(trajectories), reward_total)
    for name in names:
        members = [t for t in trajectories if family[t.task_id] == name]
        family_success = {i: v for i, v in per_task.items() if family[i] == name}
        family_rewards = [v for i, v in rewards.items() if family[i] == name]
        family_seed = derive_seed(seed, "family", name)
        figures = group_metrics(
            members,
            tasks,
            success_estimate=task_interval(family_success, family_seed) if family_success else None,
            reward=statistics.fmean(family_rewards) if family_rewards else math.nan,
            seed=family_seed,
        )
        values |= {f"{name}/{k}": v for k, v in figures.items()}
    return values
