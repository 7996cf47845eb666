"""Executors: where a batch's episodes run — in this process with n workers, or on Ray actors.

An executor opens a `BatchRunner` for a run once its rollout runner is open, and closes it when the
loop ends. `LocalExecutor` samples a batch in this process from the version's own sampling copy,
its groups dealt to `learning.pipeline.workers` shares that each sample in batches of their own;
`RayExecutor` (`ray_workers.py`) deals them to that many Ray actors the same way, so with the same
workers a run is as reproducible as in one process. Which one ran is recorded (`rollout_workers`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from reprorl.config import RunSpec
from reprorl.orchestrate.pipeline.versions import PolicyVersion
from reprorl.rollout.runner import RolloutJob, RolloutResult, RolloutRunner
from reprorl.store import RunRecord, Store
from reprorl.types import Trajectory


class BatchRunner(Protocol):
    """Runs a batch of rollout jobs from a published policy version."""

    async def publish(self, version: PolicyVersion) -> None: ...

    async def run(
        self, version: PolicyVersion, jobs: Sequence[RolloutJob], *, first_group: int = 0
    ) -> RolloutResult:
        """`first_group`: the run-wide index of the jobs' first group, which deals groups to workers."""
        ...

    async def retire_below(self, index: int) -> None: ...


class Executor(Protocol):
    """Where the pipeline's batches run, opened once per loop."""

    name: str  # "local" or "ray"

    async def open(
        self, runner: RolloutRunner, store: Store, spec: RunSpec, record: RunRecord
    ) -> BatchRunner:
        """A batch runner for this run, recorded (`rollout_workers` event)."""
        ...

    async def close(self, record: RunRecord) -> None: ...

    @property
    def workers(self) -> int:
        """Workers a batch's groups are dealt to (as `learning.pipeline.workers` asks)."""
        ...


class LocalBatches:
    """This process: the version's own sampling copy, the loop's runner, `workers` shares at once."""

    def __init__(self, runner: RolloutRunner, workers: int = 1) -> None:
        self.runner, self.workers = runner, workers

    async def publish(self, version: PolicyVersion) -> None:
        return None

    async def run(
        self, version: PolicyVersion, jobs: Sequence[RolloutJob], *, first_group: int = 0
    ) -> RolloutResult:
        runner = self.runner.with_sampler(version.sampler, version.provenance)
        if self.workers == 1:
            return await runner.run(jobs)
        shares = [share for share in deal(jobs, self.workers, first_group) if share]
        results = await asyncio.gather(*(runner.run([jobs[i] for i in share]) for share in shares))
        return merge(len(jobs), shares, results)

    async def retire_below(self, index: int) -> None:
        return None


class LocalExecutor:
    """Batches run in this process."""

    name = "local"

    def __init__(self) -> None:
        self._workers = 0

    async def open(
        self, runner: RolloutRunner, store: Store, spec: RunSpec, record: RunRecord
    ) -> BatchRunner:
        self._workers = spec.learning.pipeline.workers
        record.event("rollout_workers", backend="local", workers=self._workers)
        return LocalBatches(runner, self._workers)

    async def close(self, record: RunRecord) -> None:
        return None

    @property
    def workers(self) -> int:
        return self._workers


def deal(jobs: Sequence[RolloutJob], workers: int, first_group: int = 0) -> list[list[int]]:
    """Job indices per worker: whole groups, dealt in turn (group g to worker (first + g) mod N)."""
    shares: list[list[int]] = [[] for _ in range(workers)]
    groups: dict[str, int] = {}
    for i, job in enumerate(jobs):
        g = groups.setdefault(job.group_id, len(groups))
        shares[(first_group + g) % workers].append(i)
    return shares


def merge(count: int, shares: Sequence[Sequence[int]], results: Sequence[RolloutResult]) -> RolloutResult:
    """The shares' results as one batch's: rollouts in job order, then the retried attempts."""
    finals: list[Trajectory | None] = [None] * count
    retried: list[Trajectory] = []
    for share, result in zip(shares, results, strict=True):
        for i, trajectory in zip(share, result.trajectories, strict=True):
            finals[i] = trajectory
        retried.extend(result.retried)
    return RolloutResult(trajectories=[t for t in finals if t is not None], retried=retried)
