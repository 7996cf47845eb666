"""The planned source: each step trains on the groups drawn for it, sampled ahead within the staleness bound.

Step s trains on step s's groups (a seeded draw, with derived seeds), sampled from policy version
`version_for(s) = max(s - max_staleness, e)`, where e is the last eval point at or before s: eval
points are barriers, so every eval measures the weights of its step and a rollback rule's revert is
never undone by batches sampled from the weights it rejected. The producer waits for that version
to be published rather than sampling from whatever is newest: finished work is never thrown away
for being too stale, slow episodes are never cut to keep up, and which weights sampled which batch
does not depend on timing. With `max_staleness = 0` nothing runs ahead: each step samples from the
weights it then trains (synchronous training). Each finished batch is written to the rollout store
at once (failed rollouts too) and queued; the trainer takes batches in step order.

A checkpoint at step n holds, in `pipeline.json`, each batch sampled but not yet trained on (step,
version, its rollout part and that part's sha256), and the tensors of every version a batch from
step n on will still be sampled from (`versions/<index>.safetensors`). On resume those batches are
read back instead of sampled again, a batch that finished after the checkpoint from one of those
versions is kept as well (its part proves it was finished), and every other batch is sampled again
from the very weights it would have had; the `buffers_restored` event says what was kept.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from reprorl.orchestrate.pipeline.batches import (
    PIPELINE_FILE,
    Batch,
    VersionUser,
    cancel_all,
    gather_or_fail,
    read_result,
    save_versions,
    stored,
    version_tensors,
)
from reprorl.orchestrate.pipeline.executors import BatchRunner
from reprorl.orchestrate.pipeline.versions import PolicyVersion, PolicyVersions
from reprorl.orchestrate.run.checkpoint import Checkpoint
from reprorl.rollout.runner import RolloutJob
from reprorl.store import RunRecord
from reprorl.store.rollouts import RolloutWriter, find_parts
from reprorl.types import Split


def version_for(step: int, max_staleness: int, every_steps: int) -> int:
    """The policy version step `step`'s batch is sampled from (see the module docstring)."""
    barrier = step - step % every_steps
    return max(step - max_staleness, barrier)


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

    async def run(self, steps: Iterable[int]) -> None:
        tasks: set[asyncio.Task[None]] = set()
        try:
            for step in steps:
                version = await self.hold(self.version_for(step))
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
            self.release(version)
        path, digest = stored(self.writer, part)
        wall_s = time.perf_counter() - started
        await self.queue.put(Batch(step, version.index, version.version, result, path, digest, wall_s=wall_s))


@dataclass(frozen=True)
class BufferedBatch:
    """A batch a checkpoint names as sampled and stored but not yet trained on."""

    step: int
    version: int
    policy_version: str
    part: str
    sha256: str


class PlannedSource:
    """Each step's own groups, from the version `version_for` names (see the module docstring)."""

    name = "planned"

    def __init__(
        self,
        versions: PolicyVersions,
        writer: RolloutWriter,
        record: RunRecord,
        *,
        plan: Callable[[int], Sequence[RolloutJob]],
        steps: int,
        max_staleness: int,
        every_steps: int,
    ) -> None:
        self.versions, self.writer, self.record, self.plan = versions, writer, record, plan
        self.steps, self.max_staleness, self.every_steps = steps, max_staleness, every_steps
        self.queue = SampleQueue()
        self._restored: tuple[Path, dict[int, str]] | None = None
        self._survivors: list[BufferedBatch] = []

    def version_for(self, step: int) -> int:
        return version_for(step, self.max_staleness, self.every_steps)

    @property
    def depth(self) -> int:
        return self.queue.depth

    def produce(self, batches: BatchRunner, start: int) -> Coroutine[Any, Any, None]:
        producer = Producer(
            batches, self.versions, self.queue, self.writer, plan=self.plan, version_for=self.version_for
        )
        done = {b.step for b in self.queue.buffered()}
        return producer.run([s for s in range(start, self.steps) if s not in done])

    async def open_version(self, step: int) -> None:
        return None

    async def take(self, step: int) -> Batch:
        return await self.queue.take(step)

    # -- checkpoints ---------------------------------------------------------------------------

    def write_state(self, folder: Path, next_step: int) -> None:
        needed = {self.version_for(s) for s in range(next_step, self.steps)}
        live = self.versions.live
        versions = {i: (v.version, v.tensors) for i, v in live.items() if i in needed and i < next_step}
        entries = [
            asdict(BufferedBatch(b.step, b.version, b.policy_version, b.part, b.sha256))
            for b in self.queue.buffered()
            if b.step >= next_step and b.part is not None and b.sha256 is not None
        ]
        state = {"buffered": entries, "versions": save_versions(folder, versions)}
        (folder / PIPELINE_FILE).write_text(json.dumps(state, sort_keys=True, indent=1) + "\n")

    def keep_on_resume(self, record: RunRecord, checkpoint: Checkpoint) -> frozenset[str]:
        """The rollout parts of batches sampled ahead that the resumed run will train on."""
        self._restored, self._survivors = None, []  # a resume may try older checkpoints
        path = checkpoint.path / PIPELINE_FILE
        if not path.exists():
            return frozenset()
        data = json.loads(path.read_text())
        buffered = [BufferedBatch(**entry) for entry in data["buffered"]]
        versions = {int(i): v for i, v in data["versions"].items()}
        self._restored = (checkpoint.path, versions)
        next_step = checkpoint.state.next_step
        self._survivors = self._surviving(record, buffered, versions, next_step)
        return frozenset(b.part for b in self._survivors)

    def _surviving(
        self, record: RunRecord, buffered: list[BufferedBatch], versions: dict[int, str], next_step: int
    ) -> list[BufferedBatch]:
        """The checkpoint's buffered batches from `next_step` on, plus any later train part of a step
        whose every rollout was sampled from the version that step samples from, when the checkpoint
        holds that version (the part was finished after it; sampling again would give its bytes)."""
        kept = {b.step: b for b in buffered if b.step >= next_step}
        for path, step, digest in find_parts(record.path):
            if step < next_step or step in kept or step >= self.steps:
                continue
            index = self.version_for(step)
            expected = versions.get(index)
            if expected is None:
                continue
            # One file, read as itself: a dataset read would also parse `step=…` in its folder's name.
            table = pq.ParquetFile(path).read(columns=["split", "policy_version"])  # type: ignore[no-untyped-call]
            splits = set(table.column("split").to_pylist())
            found = set(table.column("policy_version").to_pylist())
            if splits == {Split.TRAIN.value} and found - {""} == {expected}:
                part = path.relative_to(record.path).as_posix()
                kept[step] = BufferedBatch(step, index, expected, part, digest)
        return [kept[s] for s in sorted(kept)]

    async def restore(self, start: int) -> None:
        """Put back the checkpoint's versions still to be sampled from, then its sampled batches."""
        if self._restored is None:
            return
        folder, versions = self._restored
        for index in sorted(versions):
            if index < start:
                self.versions.publish(index, version_tensors(folder, index))
                self.versions.open(index)
        batches = [
            Batch(
                b.step,
                b.version,
                b.policy_version,
                read_result(self.record, b.part, b.step, b.sha256, b.policy_version),
                b.part,
                b.sha256,
                restored=True,
            )
            for b in self._survivors
        ]
        for batch in batches:
            await self.queue.put(batch)
        self.record.event(
            "buffers_restored",
            from_step=start,
            batches=[{"step": b.step, "version": b.version, "part": b.part} for b in batches],
            rollouts=sum(len(b.result.all()) for b in batches),
            versions=sorted(i for i in versions if i < start),
        )
