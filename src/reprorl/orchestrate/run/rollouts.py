"""A run's rollouts: task draws, sampling settings, episode limits, the rollout runner, step figures.

Every job that samples from a spec's policy — training, `reprorl sample`, an eval, a screen — takes
these from here, so they draw the same tasks with the same seeds and run them the same way.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from reprorl.config import RunSpec
from reprorl.envs.base import EnvConfig
from reprorl.hashing import derive_seed
from reprorl.orchestrate.run.integrity import integrity_metrics
from reprorl.orchestrate.run.judge_reward import run_judge
from reprorl.orchestrate.run.policies import OpenedPolicy
from reprorl.rollout.agents import resolve_program
from reprorl.rollout.episode import EpisodeLimits
from reprorl.rollout.families import families_named
from reprorl.rollout.runner import BARRIERS, Barrier, RolloutResult, RolloutRunner
from reprorl.rollout.scoring import counted, exclusion_metrics
from reprorl.store import Store
from reprorl.types import SamplingParams, Task, TaskSet, Termination, Trajectory


def load_taskset(store: Store, ref: str) -> TaskSet:
    """A stored task set, read and checked against its hash."""
    return store.taskset(ref)


def sampling_params(spec: RunSpec) -> SamplingParams:
    learning = spec.learning
    return SamplingParams(
        temperature=learning.temperature,
        top_p=learning.top_p,
        top_k=learning.top_k,
        max_tokens=learning.max_tokens,
    )


def step_tasks(
    tasks: Sequence[Task], spec: RunSpec, step: int, resting: Mapping[str, int] | None = None
) -> list[Task]:
    """The tasks of one step: a seeded draw without replacement, the same on every rerun; with
    `data.family_weights`, each family's quota drawn from its own tasks; with `resting` (task id ->
    the step it may be drawn again: `data.screen`), from the tasks not resting first."""
    count = min(spec.learning.tasks_per_step, len(tasks))
    rng = random.Random(derive_seed(spec.seed, "tasks", step))
    weights = spec.data.family_weights
    if weights is None:
        return _draw(rng, list(tasks), count, resting or {})
    by_family: dict[str, list[Task]] = defaultdict(list)
    for task in tasks:
        by_family[task.family].append(task)
    sizes = {name: len(by_family[name]) for name in weights}
    drawn: list[Task] = []
    for name, quota in family_quotas(weights, sizes, count).items():
        drawn += _draw(rng, by_family[name], quota, resting or {})
    return drawn


def _draw(rng: random.Random, pool: list[Task], count: int, resting: Mapping[str, int]) -> list[Task]:
    """`count` of `pool`, seeded: the ones not resting, then the resting ones due back soonest."""
    ready = [t for t in pool if t.id not in resting]
    if len(ready) >= count:
        return rng.sample(ready, count)
    # sorted() is stable: resting tasks due back at the same step keep the pool's order.
    waiting = sorted((t for t in pool if t.id in resting), key=lambda t: resting[t.id])
    return rng.sample(ready, len(ready)) + waiting[: count - len(ready)]


def family_quotas(weights: Mapping[str, float], sizes: Mapping[str, int], count: int) -> dict[str, int]:
    """`count` tasks shared by `weights` (largest remainder, ties by name), none over a family's size.

    A share a family cannot fill goes to the others, in proportion to their weights.
    """
    quotas = {name: 0 for name in sorted(weights) if weights[name] > 0}
    left = min(count, sum(sizes[name] for name in quotas))
    while left > 0:
        open_ = [n for n in quotas if quotas[n] < sizes[n]]
        total = sum(weights[n] for n in open_)
        ideal = {n: left * weights[n] / total for n in open_}
        given = {n: min(int(ideal[n]), sizes[n] - quotas[n]) for n in open_}
        spare = left - sum(given.values())
        for n in sorted(open_, key=lambda n: (given[n] - ideal[n], n)):  # largest remainder first
            if spare == 0:
                break
            if quotas[n] + given[n] < sizes[n]:
                given[n] += 1
                spare -= 1
        for n, extra in given.items():
            quotas[n] += extra
        left = spare
    return {name: quota for name, quota in quotas.items() if quota}


def family_metrics(trajectories: Sequence[Trajectory], tasks: Iterable[Task]) -> dict[str, float]:
    """Success and reward of each env family's counted rollouts: `family/<name>/success`, ..."""
    family_of = {t.id: t.family for t in tasks}
    scored: dict[str, list[Trajectory]] = defaultdict(list)
    for t in counted(trajectories):
        if t.reward is not None and t.task_id in family_of:
            scored[family_of[t.task_id]].append(t)
    out: dict[str, float] = {}
    for name, group in sorted(scored.items()):
        rewards = [t.reward for t in group if t.reward is not None]
        out[f"family/{name}/success"] = statistics.fmean(r.success for r in rewards)
        out[f"family/{name}/reward_mean"] = statistics.fmean(r.total for r in rewards)
        out[f"family/{name}/rollouts"] = float(len(rewards))
    return out


def episode_limits(spec: RunSpec) -> EpisodeLimits:
    learning = spec.learning
    return EpisodeLimits(
        max_turns=learning.max_turns,
        max_tokens=learning.max_turns * learning.max_tokens,
        wall_s=learning.episode_wall_s,
    )


def runner_for(
    opened: OpenedPolicy,
    spec: RunSpec,
    run_id: str,
    store_root: Path,
    *,
    families: Iterable[str],
    barrier: Barrier | None = None,
) -> RolloutRunner:
    """The run's rollout runner: its sampling, limits, env settings, reward weights and judge.

    `families`: the env families of the tasks it will run (their tools are what its sandboxes load).
    `barrier`: which turns share a sampling batch, when not the spec's `learning.pipeline.lockstep` (a rerun
    following its record's batches)."""
    learning = spec.learning
    return RolloutRunner(
        opened.sampler,
        opened.renderer,
        run_id=run_id,
        params=sampling_params(spec),
        provenance=opened.provenance,
        limits=episode_limits(spec),
        families=families_named(families),
        env_config=EnvConfig.from_spec(spec.data),
        reward_weights=spec.data.reward_weights,
        prices=spec.budget.prices,
        concurrency=learning.rollout_concurrency,
        max_batch=learning.rollout_concurrency,
        judge=run_judge(spec, store_root),
        barrier=barrier or BARRIERS[learning.pipeline.lockstep](),
        verifier_timeout_s=spec.data.verifier_timeout_s,
        agent=resolve_program(spec.agent) if spec.agent is not None else None,
    )


def progress_bar(label: str, show: bool) -> Progress:
    """A bar of done / total with elapsed time, shown only when asked (a terminal), gone when done."""
    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not show,
        transient=True,
    )


def step_metrics(result: RolloutResult, tasks: Iterable[Task] = ()) -> dict[str, float]:
    """A step's rollout figures; `tasks` (those the step drew from) let signatures read the references."""
    finals, tasks = result.trajectories, list(tasks)
    # Rollouts the platform, verifier or judge failed are left out, never counted as reward 0; a
    # step with none left has no reward to report (NaN), not a zero one.
    scored = [t.reward for t in counted(finals) if t.reward is not None]
    return {
        "reward_mean": statistics.fmean(r.total for r in scored) if scored else math.nan,
        "success": statistics.fmean(r.success for r in scored) if scored else math.nan,
        "rollouts": float(len(finals)),
        **exclusion_metrics(finals),
        "infra_retries": float(len(result.retried)),
        "infra_failures": float(sum(t.termination is Termination.INFRA_ERROR for t in finals)),
        "completion_tokens": float(sum(t.completion_tokens for t in finals)),
        "prompt_tokens": float(sum(t.prompt_tokens for t in finals)),
        "cost_usd": sum(t.cost_usd for t in result.all()),
        "cpu_s": sum(t.cpu_s for t in result.all()),
        **integrity_metrics(finals, tasks),
        **family_metrics(finals, tasks),
    }
