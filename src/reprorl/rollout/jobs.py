"""Rollout jobs: one episode to run (task, group, member, seed), and the plan of a step's groups.

Jobs are planned from the run's seed: member m of task t at step s gets the seed
`derive_seed(run_seed, kind, s, t, m)`, so a rerun draws the same groups and members differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reprorl.hashing import derive_seed
from reprorl.rollout.episode import Policy
from reprorl.types import SamplingParams, Task


@dataclass(frozen=True)
class RolloutJob:
    """One rollout to produce: a task, its place in a group, and its seed."""

    task: Task
    rollout_id: str
    group_id: str
    member: int
    step: int
    seed: int
    # Lower is sampled first where more turns wait than a batch holds (the ready lockstep): the
    # arrival-order producer gives a group its place in the start order, which is earliest deadline
    # first. It never changes what is sampled.
    priority: int = 0
    # Sampling parameters in place of the runner's (an eval point's own temperature); None: the runner's.
    params: SamplingParams | None = None


PolicyFactory = Callable[[RolloutJob, str], Policy]
"""Makes one episode's policy from its job and rollout id (scripted runs; see `with_policy`)."""


def plan_groups(
    tasks: Sequence[Task],
    group_size: int,
    *,
    run_id: str,
    run_seed: int,
    step: int,
    kind: str = "train",
    seed_step: int | None = None,
) -> list[RolloutJob]:
    """G jobs per task; ids read `<run_id>/<kind>/<step>/<task_id>/<member>`.

    Seeds derive from (run seed, kind, step, task, member); `seed_step` replaces the step in that
    derivation, so evaluations at different steps can draw with the same seeds (paired points).
    """
    if group_size < 1:
        raise ValueError("group_size must be at least 1")
    jobs = []
    for task in tasks:
        group_id = f"{run_id}/{kind}/{step}/{task.id}"
        for member in range(group_size):
            jobs.append(
                RolloutJob(
                    task=task,
                    rollout_id=f"{group_id}/{member}",
                    group_id=group_id,
                    member=member,
                    step=step,
                    seed=derive_seed(
                        run_seed, kind, step if seed_step is None else seed_step, task.id, member
                    ),
                )
            )
    return jobs
