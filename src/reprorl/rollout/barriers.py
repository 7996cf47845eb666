"""Barriers: which episodes' model turns wait for each other, to be sampled as one batch.

The whole batch's (`BatchBarrier`, the largest batches) or only a group's (`GroupBarrier`: with slow,
uneven tools a group no longer waits for another's slowest call); either way a batch depends on what
its episodes did, never on timing. `ReadyBarrier` trades that for throughput: a group's turns, once
all asked, join one open pool per sampler across calls, sampled with whatever else is waiting.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Protocol

from reprorl.policy.sampling import Sampler
from reprorl.rollout.jobs import RolloutJob
from reprorl.rollout.model_policy import Gate, Lockstep, OpenLockstep, PoolRound
from reprorl.rollout.recorded_batches import RecordedBatches, RecordedRound, TurnSchedule


class Barrier(Protocol):
    """Which episodes' model turns wait for each other, to be sampled as one batch."""

    name: str

    def parts(self, jobs: Sequence[RolloutJob], concurrency: int) -> tuple[list[list[int]], int]:
        """Job indices that share a lockstep, part by part, and how many parts may run at once."""
        ...

    def lockstep(self, sampler: Sampler, max_batch: int, priority: int = 0) -> Gate:
        """Where one part's model turns wait to be batched; `priority` is its jobs' (lower first,
        where the barrier lets parts compete for a batch)."""
        ...


class BatchBarrier:
    """Every episode of the batch: the largest batches, and each turn waits for the batch's slowest
    tool call."""

    name = "batch"

    def parts(self, jobs: Sequence[RolloutJob], concurrency: int) -> tuple[list[list[int]], int]:
        return [list(range(len(jobs)))], 1

    def lockstep(self, sampler: Sampler, max_batch: int, priority: int = 0) -> Gate:
        return Lockstep(sampler, max_batch=max_batch)


class GroupBarrier(BatchBarrier):
    """A group's members only: a turn waits for the slowest tool call of its own group, never of
    another, at the price of more, smaller batches. Groups run whole, as many at once as
    `concurrency` holds (at least one)."""

    name = "group"

    def parts(self, jobs: Sequence[RolloutJob], concurrency: int) -> tuple[list[list[int]], int]:
        groups: dict[str, list[int]] = {}
        for i, job in enumerate(jobs):
            groups.setdefault(job.group_id, []).append(i)
        largest = max((len(g) for g in groups.values()), default=1)
        return list(groups.values()), max(1, concurrency // largest)


class ReadyBarrier(GroupBarrier):
    """A group's members wait for each other (as with `GroupBarrier`), then join one `OpenLockstep`
    per sampler, shared by every batch and call: the groups waiting when the sampler comes free are
    sampled together, so no group waits for another's tool call and batches still fill. Batches
    depend on timing; each turn records its own."""

    name = "ready"

    def __init__(self, follow: TurnSchedule | None = None, run_id: str = "") -> None:
        """`follow`: a recorded run's turn batches, which this barrier then samples every turn in
        (`reprorl.rollout.recorded_batches`) instead of whatever is waiting; `run_id` is the
        following run's, whose rollout ids stand for the recorded ones."""
        self.follow, self.run_id = follow, run_id
        self._open: weakref.WeakKeyDictionary[Sampler, OpenLockstep] = weakref.WeakKeyDictionary()
        self._recorded: weakref.WeakKeyDictionary[Sampler, RecordedBatches] = weakref.WeakKeyDictionary()

    def lockstep(self, sampler: Sampler, max_batch: int, priority: int = 0) -> Gate:
        if self.follow is not None:
            pool = self._recorded.get(sampler)
            if pool is None:
                pool = self._recorded[sampler] = RecordedBatches(
                    sampler, self.follow, self.run_id, max_batch=max_batch
                )
            return RecordedRound(pool)
        shared = self._open.get(sampler)
        if shared is None:
            shared = self._open[sampler] = OpenLockstep(sampler, max_batch=max_batch)
        return PoolRound(shared, priority)


BARRIERS: dict[str, type[BatchBarrier]] = {
    "batch": BatchBarrier,
    "group": GroupBarrier,
    "ready": ReadyBarrier,
}
