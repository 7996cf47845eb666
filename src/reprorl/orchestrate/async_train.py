"""The asynchronous training loop: rollout workers sample ahead while the trainer trains, joined by a queue.

Step s trains on step s's batch (the groups the synchronous loop would draw), sampled from policy
version `max(s - max_staleness, e)`, where e is the last eval point at or before s: eval points are
barriers, so every eval measures the weights of its step and a rollback rule's revert is never
undone by batches sampled from the weights it rejected. The producer (`pipeline.Producer`) runs
ahead as far as that bound allows and no further: pacing, not dropping. With `max_staleness = 0`
nothing runs ahead and the run is bit-identical to the synchronous loop's.

Tokens sampled by an older version are corrected toward the trainer's proximal policy by the
spec's importance correction (truncated IS by default); `learning.correction = "none"` turns that
off, and the run records the choice as an event. Per step the loop logs the batch's staleness, the
queue depth, how long the trainer waited and the share of its time it was busy (`timing/` figures
depend on speed, not on the run's conditions).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from rich.progress import Progress, TaskID

from reprorl.evaluation.point import EvalPoint
from reprorl.orchestrate.budget import BudgetMeter
from reprorl.orchestrate.buffers import (
    BufferedBatch,
    PipelineState,
    load_pipeline,
    read_batch,
    save_pipeline,
    surviving_batches,
    version_tensors,
)
from reprorl.orchestrate.checkpoint import Checkpoint
from reprorl.orchestrate.effective import effective_config, write_effective
from reprorl.orchestrate.loop import TrainLoop
from reprorl.orchestrate.pipeline import Batch, Producer, SampleQueue
from reprorl.orchestrate.policies import OpenedPolicy
from reprorl.orchestrate.sample import progress_bar
from reprorl.orchestrate.steps import group_data
from reprorl.orchestrate.versions import PolicyVersions
from reprorl.orchestrate.workers import BatchRunner, LocalBatches, RayBatches, start_ray_workers
from reprorl.rollout.runner import RolloutRunner
from reprorl.store import RunRecord


def version_for(step: int, max_staleness: int, every_steps: int) -> int:
    """The policy version step `step`'s batch is sampled from (see the module docstring)."""
    barrier = step - step % every_steps
    return max(step - max_staleness, barrier)


class AsyncTrainLoop(TrainLoop):
    """`TrainLoop` with a producer sampling ahead of the trainer through the sample queue."""

    def open_sampling(self) -> None:
        self.versions = PolicyVersions(
            self.trainer, self.loaded, self.dtype, self.renderer.template_hash, keeper=self.keeper
        )
        self.queue = SampleQueue()
        self.restored: tuple[Path, PipelineState] | None = None
        self.survivors: list[BufferedBatch] = []
        self.current = 0  # the version the trainer's weights are: updates taken
        self.ray: str | None = None  # a Ray cluster address ("local" starts one) for the workers
        self._busy_since = time.perf_counter()

    def version_for(self, step: int) -> int:
        return version_for(step, self.learning.max_staleness, self.spec.evaluation.every_steps)

    def refresh_policy(self, step: int) -> None:
        self.version = self.versions.publish(step)
        self.current = step
        self.sampler = self.version.sampler
        self.opened = OpenedPolicy(self.loaded, self.sampler, self.renderer, self.version.provenance)

    # -- checkpoints ---------------------------------------------------------------------------

    def _write_state(self, folder: Path) -> None:
        super()._write_state(folder)
        next_step = self.current
        needed = {self.version_for(s) for s in range(next_step, self.learning.steps)}
        versions = {
            i: (v.version, v.tensors) for i, v in self.versions.live.items() if i in needed and i < next_step
        }
        save_pipeline(folder, [b for b in self.queue.buffered() if b.step >= next_step], versions)

    def keep_on_resume(self, record: RunRecord, checkpoint: Checkpoint) -> frozenset[str]:
        """The rollout parts of batches sampled ahead that the resumed run will train on."""
        state = load_pipeline(checkpoint.path)
        if state is None:
            return frozenset()
        self.restored = (checkpoint.path, state)
        next_step = checkpoint.state.next_step
        steps = {s: self.version_for(s) for s in range(next_step, self.learning.steps)}
        self.survivors = surviving_batches(record, state, next_step, steps)
        return frozenset(b.part for b in self.survivors)

    async def _restore(self, start: int) -> None:
        """Put back what a checkpoint held of the pipeline: its versions, then its sampled batches."""
        if self.restored is None:
            return
        folder, state = self.restored
        for index in sorted(state.versions):
            if index < start:
                self.versions.publish(index, version_tensors(folder, index))
                self.versions.open(index)
        batches = [read_batch(self.record, b) for b in self.survivors]
        for batch in batches:
            await self.queue.put(batch)
        self.record.event(
            "buffers_restored",
            from_step=start,
            batches=[{"step": b.step, "version": b.version, "part": b.part} for b in batches],
            rollouts=sum(len(b.result.all()) for b in batches),
            versions=sorted(i for i in state.versions if i < start),
        )

    # -- the loop ------------------------------------------------------------------------------

    async def train_batch(self, batch: Batch, wait_s: float, versions: Sequence[int] = ()) -> None:
        """One update on a queued batch, run off the event loop so sampling goes on meanwhile.

        `versions`: the version of each of its groups, when they differ (arrival order)."""
        step = batch.step
        data, group_stats = group_data(batch.result.trajectories, self.learning)
        if self.unscored_stop(step, batch.result.trajectories, "training"):
            data = []
        t1 = time.perf_counter()
        train = await asyncio.to_thread(self.update, data, step)
        train_s = time.perf_counter() - t1
        cycle = time.perf_counter() - self._busy_since
        self._busy_since = time.perf_counter()
        lags = [float(step - v) for v in versions or (batch.version,)]
        timing = {
            "rollout_s": batch.wall_s,
            "rollout_cpu_s": sum(t.cpu_s for t in batch.result.all()),
            "train_s": train_s,
            "timing/wait_s": wait_s,
            "timing/trainer_busy": train_s / cycle if cycle > 0 else 1.0,
            "timing/queue_depth": float(self.queue_depth()),
        }
        group_stats.update(staleness_mean=statistics.fmean(lags), staleness_max=max(lags))
        self.log_step(step, batch.result, data, group_stats, train, timing, batch.policy_version)

    async def run(self, start: int, *, show_progress: bool = False) -> list[EvalPoint]:
        learning, points = self.learning, []
        if learning.correction == "none":
            self.record.event(
                "off_policy_correction_off", max_staleness=learning.max_staleness, field="learning.correction"
            )
        await self._restore(start)
        self.refresh_policy(start)
        with progress_bar("training", show_progress) as progress:
            bar = progress.add_task("steps", total=learning.steps, completed=start)
            async with self.open_runner() as runner:
                write_effective(self.record, effective_config(self, runner))
                batches = await self._batches(runner)
                sampling = asyncio.create_task(self.produce(batches, start))
                try:
                    points = await self._train(runner, start, progress, bar)
                finally:
                    sampling.cancel()
                    await asyncio.gather(sampling, return_exceptions=True)
                    if isinstance(batches, RayBatches):
                        await batches.stop()
                        if batches.lost:
                            self.record.event("rollout_workers_lost", workers=batches.lost)
        return points

    def queue_depth(self) -> int:
        return self.queue.depth

    def produce(self, batches: BatchRunner, start: int) -> Coroutine[Any, Any, None]:
        """The producer's work: sample what steps `start` onwards train on, as far ahead as the bound
        allows. What is still to sample is decided now, before the trainer takes anything."""
        producer = Producer(
            batches, self.versions, self.queue, self.writer, plan=self.plan, version_for=self.version_for
        )
        done = {b.step for b in self.queue.buffered()}
        return producer.run([s for s in range(start, self.learning.steps) if s not in done])

    async def open_version(self, step: int) -> None:
        """Let the producer sample from version `step` (its eval point, if any, is behind it)."""
        self.versions.open(step)

    async def train_step(self, step: int) -> None:
        waited = time.perf_counter()
        batch = await self.queue.take(step)
        await self.train_batch(batch, time.perf_counter() - waited)

    async def _batches(self, runner: RolloutRunner) -> BatchRunner:
        """Where batches run: this process, or Ray actors; recorded, since the split shapes results."""
        workers = self.learning.rollout_workers
        if self.ray is None:
            self.record.event("rollout_workers", backend="local", workers=workers)
            return LocalBatches(runner, workers)
        batches, info = await start_ray_workers(self.ray, self.store, self.spec, self.record.run_id, runner)
        self.record.event("rollout_workers", **info)
        return batches

    async def _train(
        self, runner: RolloutRunner, start: int, progress: Progress, bar: TaskID
    ) -> list[EvalPoint]:
        learning, points = self.learning, []
        self.budget = BudgetMeter.of_record(self.spec.budget, self.record)
        for step in range(start, learning.steps + 1):
            if self.budget_stop(step):
                break
            if step != start:
                self.refresh_policy(step)
            if self.eval_due(step):
                new = await self.evaluate(runner.with_sampler(self.sampler, self.version.provenance), step)
                points.extend(new)
                if self.stopped or (self.guard is not None and not self.guard_points(step, new)):
                    break
            await self.open_version(step)
            if step == learning.steps:
                break
            await self.train_step(step)
            if self.stopped:
                break
            self.current = step + 1
            progress.advance(bar)
            if (step + 1) % learning.checkpoint_every == 0 and step + 1 < learning.steps:
                self.save(step + 1)
        return points
