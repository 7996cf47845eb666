"""The sample queue and its producer: batches sampled ahead of the trainer, paced by the staleness bound.

The producer walks the run's steps in order and samples step s's batch (the same groups, with the
same seeds, as the synchronous loop plans) from policy version `version_for(s)`. It waits for that
version to be published rather than sampling from whatever is newest: finished work is never
thrown away for being too stale, slow episodes are never cut to keep up, and which weights sampled
which batch does not depend on timing, so an asynchronous run is as reproducible as a synchronous
one. Each finished batch is written to the rollout store at once (failed rollouts too) and queued;
the trainer takes batches in step order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from reprorl.orchestrate.versions import PolicyVersion, PolicyVersions
from reprorl.orchestrate.workers import BatchRunner
from reprorl.rollout.runner import RolloutJob, RolloutResult
from reprorl.store.rollouts import PartFile, RolloutWriter


@dataclass(frozen=True)
class Batch:
    """One step's sampled groups, the policy version that sampled them, and where they are stored."""

    step: int
    version: int  # the policy version (updates taken) its tokens were sampled from
    policy_version: str  # that version's hash, as its rollouts record it
    result: RolloutResult
    part: str | None  # its rollout part, relative to the run folder
    sha256: str | None
    wall_s: float = 0.0  # from the batch's start to its last episode's end
    restored: bool = False  # read back from a checkpoint's buffer rather than sampled by this process


class SampleQueue:
    """Finished batches by step, until the trainer takes them; a producer failure reaches the trainer."""

    def __init__(self) -> None:
        self._done: dict[int, Batch] = {}
        self._changed = asyncio.Condition()
        self._failure: BaseException | None = None

    async def put(self, batch: Batch) -> None:
        async with self._changed:
            self._done[batch.step] = batch
            self._changed.notify_all()

    async def fail(self, exc: BaseException) -> None:
        async with self._changed:
            self._failure = exc
            self._changed.notify_all()

    async def take(self, step: int) -> Batch:
        """Step `step`'s batch, waiting for it; raises what stopped the producer, if anything did."""
        async with self._changed:
            await self._changed.wait_for(lambda: step in self._done or self._failure is not None)
            if step not in self._done:
                assert self._failure is not None
                # The producer's own error (a bad task is the user's, and says so), not a wrapper.
                raise self._failure
            return self._done.pop(step)

    def buffered(self) -> list[Batch]:
        """Batches sampled and stored but not yet trained on, in step order."""
        return [self._done[s] for s in sorted(self._done)]

    @property
    def depth(self) -> int:
        return len(self._done)


class VersionUser:
    """What a producer does with policy versions: ship each to the batch runner once, hold one
    while a batch samples from it, and retire those nothing will sample from again."""

    def __init__(self, batches: BatchRunner, versions: PolicyVersions) -> None:
        self.batches, self.versions = batches, versions
        self._shipped: set[int] = set()  # versions the batch runner has received
        self._newest = -1  # the version the latest started batch samples from

    async def hold(self, index: int) -> PolicyVersion:
        """Version `index`, once published and open, held for one batch."""
        version = await self.versions.wait(index)
        if index not in self._shipped:
            await self.batches.publish(version)
            self._shipped.add(index)
        version.users += 1
        self._newest = max(self._newest, index)
        self.versions.retire_below(self._newest)
        await self.batches.retire_below(self._newest)
        return version

    def release(self, version: PolicyVersion) -> None:
        version.users -= 1
        self.versions.retire_below(self._newest)


Fail = Callable[[BaseException], Awaitable[None]]


def stored(writer: RolloutWriter, part: PartFile | None) -> tuple[str | None, str | None]:
    """A written part as a queue entry names it: its path in the run folder, its sha256."""
    if part is None:
        return None, None
    return part.path.relative_to(writer.run_dir).as_posix(), part.sha256


async def gather_or_fail(tasks: set[asyncio.Task[None]], fail: Fail) -> None:
    """Wait for a producer's tasks; on an error cancel the rest and pass the error on (`fail`)."""
    try:
        await asyncio.gather(*tasks)
    except BaseException as exc:
        await cancel_all(tasks, exc, fail)
        raise


async def cancel_all(tasks: set[asyncio.Task[None]], exc: BaseException, fail: Fail) -> None:
    """Cancel a producer's tasks after `exc`, and tell the trainer unless it was a cancellation."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if not isinstance(exc, asyncio.CancelledError):
        await fail(exc)


class Producer(VersionUser):
    """Samples each step's batch from the version the staleness bound names, as soon as it exists."""

    def __init__(
        self,
        batches: BatchRunner,
        versions: PolicyVersions,
        queue: SampleQueue,
        writer: RolloutWriter,
        *,
        plan: Callable[[int], Sequence[RolloutJob]],
        version_for: Callable[[int], int],
    ) -> None:
        super().__init__(batches, versions)
        self.queue, self.writer = queue, writer
        self.plan, self.version_for = plan, version_for
        self.in_flight: set[int] = set()

    async def run(self, steps: Iterable[int]) -> None:
        tasks: set[asyncio.Task[None]] = set()
        try:
            for step in steps:
                version = await self.hold(self.version_for(step))
                self.in_flight.add(step)
                tasks.add(asyncio.create_task(self._sample(step, version)))
        except BaseException as exc:
            await cancel_all(tasks, exc, self.queue.fail)
            raise
        await gather_or_fail(tasks, self.queue.fail)

    async def _sample(self, step: int, version: PolicyVersion) -> None:
        started = time.perf_counter()
        try:
            result = await self.batches.run(version, self.plan(step))
            part = self.writer.write(step, result.all())
        finally:
            self.in_flight.discard(step)
            self.release(version)
        path, digest = stored(self.writer, part)
        wall_s = time.perf_counter() - started
        await self.queue.put(Batch(step, version.index, version.version, result, path, digest, wall_s=wall_s))
