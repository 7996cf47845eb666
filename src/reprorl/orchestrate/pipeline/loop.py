"""The training loop: one loop for every pipeline — a source of batches, an executor, and a timing.

The loop publishes a policy version before every step (version v: the weights after v updates),
runs the eval points on the spec's frozen suites (before the first step, every
`evaluation.every_steps`, after the last), lets the source sample from the version, takes the
step's batch from it, and takes one policy-gradient update: groups become advantages, zero-variance
groups are dropped (and counted) if the spec says so. What varies is composed, not subclassed:

- the *source* (`learning.pipeline.source`): `planned` (each step's own groups, sampled ahead
  within `max_staleness`; 0 is synchronous training) or `arrival` (groups in the order they finish,
  each by its staleness deadline);
- the *executor*: this process with `learning.pipeline.workers` shares, or that many Ray actors;
- the *timing*: live, or a recorded run's schedule followed (`reprorl reproduce`), handed once to
  both the rollout side (which turns share a sampling batch) and the source (which groups a step
  trains on).

Tokens sampled by an older version are corrected toward the trainer's proximal policy by the spec's
importance correction; `learning.correction = "none"` turns that off, and the run records the
choice as an event when a sample may lag. Per step the loop logs the batch's staleness, the queue
depth, how long the trainer waited and the share of its time it was busy (`timing/` figures depend
on speed, not on the run's conditions). Health metrics go to `metrics.jsonl` every step, a
checkpoint follows every `learning.checkpoint_every` steps, and a killed run resumes exactly.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import torch

from reprorl.config import RunSpec
from reprorl.evaluation.point import EvalPoint, evaluate
from reprorl.orchestrate.pipeline.arrival import Schedule
from reprorl.orchestrate.pipeline.arrival_source import ArrivalSource
from reprorl.orchestrate.pipeline.batches import Batch, Source
from reprorl.orchestrate.pipeline.executors import Executor
from reprorl.orchestrate.pipeline.planned import PlannedSource
from reprorl.orchestrate.pipeline.steps import group_data, health, learning_rate, make_loss, prepare
from reprorl.orchestrate.pipeline.timing import Timing
from reprorl.orchestrate.pipeline.versions import PolicyVersion, PolicyVersions, trained_version
from reprorl.orchestrate.run.budget import BudgetMeter
from reprorl.orchestrate.run.checkpoint import (
    GOOD_PREFIX,
    Checkpoint,
    LoopState,
    good_checkpoint,
    save_checkpoint,
)
from reprorl.orchestrate.run.effective import effective_config, write_effective
from reprorl.orchestrate.run.exploration import ALARM_EVENT, ExplorationWatch, open_watch
from reprorl.orchestrate.run.guarding import LoopGuard
from reprorl.orchestrate.run.integrity import CONTRADICTED
from reprorl.orchestrate.run.kept_versions import VersionKeeper
from reprorl.orchestrate.run.policies import OpenedPolicy, kept_bytes, torch_dtype
from reprorl.orchestrate.run.rollouts import load_taskset, progress_bar, runner_for, step_metrics, step_tasks
from reprorl.orchestrate.run.setup import eval_suites
from reprorl.orchestrate.run.signal_pool import SignalPool, observe_step, open_pool
from reprorl.orchestrate.run.stops import budget_stop, unscored_stop
from reprorl.orchestrate.run.warm_start import warm_start_run
from reprorl.policy import LoadedModel
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.vllm_engine import RolloutEngine
from reprorl.rollout.runner import RolloutJob, RolloutResult, RolloutRunner, plan_groups
from reprorl.store import RunRecord, Store
from reprorl.store.rollouts import RolloutWriter
from reprorl.threads import native_thread
from reprorl.trainer import AdamParams, Datum, EWMAWeights, LocalTrainer
from reprorl.types import Split

EWMA_FILE = "ewma.pt"


class TrainLoop:
    """One run's loop state; `run()` takes it from its cursor to the end."""

    def __init__(
        self,
        store: Store,
        spec: RunSpec,
        record: RunRecord,
        loaded: LoadedModel,
        trainer: LocalTrainer,
        ewma: EWMAWeights | None,
        *,
        executor: Executor,
        timing: Timing,
        engine: RolloutEngine | None = None,
    ) -> None:
        self.store, self.spec, self.record, self.loaded = store, spec, record, loaded
        self.trainer, self.ewma, self.executor, self.timing = trainer, ewma, executor, timing
        self.learning = learning = spec.learning
        taskset = load_taskset(store, str(spec.data.train))
        self.train_version = taskset.version  # the content hash of the tasks the loop draws from
        self.tasks = taskset.split(Split.TRAIN)
        self.family_of = {t.id: t.family for t in self.tasks}
        self.watch = ExplorationWatch({}, 0)  # the run's own, with its needed tools, when it runs
        self.pool: SignalPool | None = None  # with data.screen: the verdicts each step's draw reads
        if not self.tasks:
            raise ValueError(f"data.train: {spec.data.train} has no train-split tasks")
        self.suites = eval_suites(store, spec)
        # The env families the run's tasks need: what its sandboxes load tools for.
        suite_tasks = [t for suite in self.suites for t in suite.tasks]
        self.families = sorted({t.family for t in [*self.tasks, *suite_tasks]})
        self.writer = RolloutWriter(record)
        self.loss = make_loss(learning)
        self.renderer = ChatRenderer(loaded.tokenizer)
        self.dtype: torch.dtype = torch_dtype(spec.model.sampling_dtype)
        self.guard = (
            LoopGuard(spec, {s.name: s.tasks for s in self.suites}) if spec.evaluation.rollback else None
        )
        self.stopped: str | None = None  # why a rule ended the run early
        self.keeper = VersionKeeper(record)  # every version sampled from, so each rollout replays
        native_thread("train")  # started now, with its thread team, while memory is plentiful
        self.budget = BudgetMeter(spec.budget)  # what was spent; `run()` reads it from the record
        pipeline = learning.pipeline
        self.engine = engine
        self.versions = PolicyVersions(
            trainer,
            loaded,
            self.dtype,
            self.renderer.template_hash,
            keeper=self.keeper,
            overlap=pipeline.max_staleness > 0,
            engine=engine,
            engine_dir=record.path / "engine" / "adapters",
            keep_bytes=kept_bytes(spec),
        )
        self.source = self._source()
        self.current = 0  # the version the trainer's weights are: updates taken
        self._busy_since = time.perf_counter()

    def _source(self) -> Source:
        pipeline, every = self.learning.pipeline, self.spec.evaluation.every_steps
        if pipeline.source == "planned":
            return PlannedSource(
                self.versions,
                self.writer,
                self.record,
                plan=self.plan,
                steps=self.learning.steps,
                max_staleness=pipeline.max_staleness,
                every_steps=every,
            )
        schedule = Schedule(
            per_step=min(self.learning.tasks_per_step, len(self.tasks)),
            max_staleness=pipeline.max_staleness,
            every_steps=every,
            steps=self.learning.steps,
        )
        return ArrivalSource(
            self.versions,
            self.writer,
            self.record,
            plan=self.plan,
            group_size=self.learning.group_size,
            schedule=schedule,
            queue=self.timing.arrival_queue(schedule),
        )

    def plan(self, step: int) -> list[RolloutJob]:
        """The groups of step `step`: its seeded tasks, G members each, with derived seeds."""
        resting = self.pool.resting(step) if self.pool is not None else None
        return plan_groups(
            step_tasks(self.tasks, self.spec, step, resting),
            self.learning.group_size,
            run_id=self.record.run_id,
            run_seed=self.spec.seed,
            step=step,
        )

    def refresh_policy(self, step: int) -> PolicyVersion:
        """Publish the trainer's weights as they are now (before `step`) as version `step`."""
        if isinstance(self.source, PlannedSource):
            # No later step samples from a version before this one: its copy can be reused now.
            self.versions.retire_below(self.source.version_for(step))
        self.version = self.versions.publish(step)
        self.current = step
        return self.version

    # -- checkpoints ---------------------------------------------------------------------------

    def save(self, next_step: int) -> None:
        size = (self.record.path / "metrics.jsonl").stat().st_size
        state = LoopState(
            next_step=next_step, metrics_bytes=size, policy_version=trained_version(self.trainer)
        )
        save_checkpoint(self.record, state, self._write_state, keep=self.learning.keep_checkpoints)

    def _write_state(self, folder: Path) -> None:
        self.trainer.save_state(folder)
        if self.ewma is not None:
            torch.save(self.ewma.state_dict(), folder / EWMA_FILE)
        if self.guard is not None:
            self.guard.save(folder)
        self.source.write_state(folder, self.current)

    def keep_on_resume(self, record: RunRecord, checkpoint: Checkpoint) -> frozenset[str]:
        """Rollout parts past `checkpoint` that a resume keeps: what the source had sampled ahead."""
        return self.source.keep_on_resume(record, checkpoint)

    def load(self, folder: Path, *, guard: bool = True) -> None:
        """Take the trained weights, optimizer, RNG (and EWMA, guard) state of a checkpoint folder."""
        self.trainer.load_state(folder)
        if self.ewma is not None:
            self.ewma.load_state_dict(torch.load(folder / EWMA_FILE, weights_only=True))
        if guard and self.guard is not None:
            self.guard.load(folder)

    # -- rules ---------------------------------------------------------------------------------

    def guard_points(self, step: int, points: list[EvalPoint]) -> bool:
        """Check the rollback rules at this eval point and act; False when the run must end."""
        assert self.guard is not None
        verdict = self.guard.check(self.record, step, points)
        if verdict.passed:
            state = LoopState(next_step=step, metrics_bytes=0, policy_version=trained_version(self.trainer))
            save_checkpoint(self.record, state, self._write_state, keep=None, prefix=GOOD_PREFIX)
            return True
        rules = [f.when for f in verdict.fired]
        good = good_checkpoint(self.record, step) if verdict.action == "revert" else None
        if good is None:
            self.stopped = f"rollback rule {', '.join(rules)} fired at step {step}"
            self.record.event("stopped_by_rule", step=step, rules=rules, action=verdict.action)
            return False
        # Only the weights go back: the guard keeps its history (the failed check is part of what it
        # judges by) and the cost already spent.
        self.load(good.path, guard=False)
        self.refresh_policy(step)
        self.record.event(
            "reverted",
            step=step,
            to_step=good.state.next_step,
            rules=rules,
            policy_version=good.state.policy_version,
        )
        return True

    async def warm_start(self) -> None:
        await warm_start_run(self.record, self.spec, self.loaded, self.tasks, self.trainer)

    # -- eval points and updates ---------------------------------------------------------------

    async def evaluate(self, runner: RolloutRunner, step: int) -> list[EvalPoint]:
        """An eval point of every suite, sampled by `runner` (whose sampler holds this step's weights)."""
        assert runner.sampler is not None, "eval points sample from the model"
        points = []
        for suite in self.suites:
            t0, c0 = time.perf_counter(), time.process_time()
            point = await evaluate(
                runner,
                suite.name,
                suite.tasks,
                run_id=self.record.run_id,
                run_seed=self.spec.seed,
                step=step,
                policy_version=runner.sampler.policy_version,
                samples_per_task=self.spec.evaluation.samples_per_task,
                thresholds=self.spec.evaluation.thresholds,
                temperature=self.spec.evaluation.temperature,
            )
            self.writer.write(step, point.result.all())
            timing = {"eval_s": time.perf_counter() - t0, "eval_cpu_s": time.process_time() - c0}
            self.budget.spend(point.result.all(), timing)
            self.record.log_metrics(
                step,
                {**point.metrics(), **timing},
                stage="eval",
                suite=suite.ref,
                policy_version=point.policy_version,
            )
            points.append(point)
            self.stopped = unscored_stop(
                self.spec, self.record, step, point.result.trajectories, f"eval {suite.name}"
            )
            if self.stopped:
                break
        return points

    def eval_due(self, step: int) -> bool:
        every = self.spec.evaluation.every_steps
        return step == 0 or step == self.learning.steps or step % every == 0

    def update(self, data: list[Datum], step: int) -> dict[str, float]:
        """One optimizer step on `data` (none without data); the loss's and optimizer's figures."""
        if not data:
            return {}
        learning = self.learning
        data = prepare(self.trainer, data, self.loss, self.ewma, reference=learning.kl.measured_at(step))
        started = time.perf_counter()
        train = self.trainer.forward_backward(data, self.loss)
        train.update(self.trainer.optim_step(AdamParams(lr=learning_rate(learning, step))))
        train["update_s"] = time.perf_counter() - started  # against `model_flops`: the update's bound
        if self.ewma is not None:
            self.ewma.update()
        return {f"train/{k}": v for k, v in train.items()}

    async def train_batch(self, batch: Batch, wait_s: float) -> None:
        """One update on a batch, run off the event loop so sampling goes on meanwhile."""
        step = batch.step
        data, group_stats = group_data(batch.result.trajectories, self.learning)
        if self.pool is not None:  # before the next version opens: a later step's draw reads it
            group_stats.update(observe_step(self.pool, self.record, step, batch.result.trajectories))
        self.stopped = unscored_stop(self.spec, self.record, step, batch.result.trajectories, "training")
        if self.stopped:
            data = []
        t1, c1 = time.perf_counter(), time.process_time()
        train = await native_thread("train").run(self.update, data, step)
        train_s = time.perf_counter() - t1
        cycle = time.perf_counter() - self._busy_since
        self._busy_since = time.perf_counter()
        lags = [float(step - v) for v in batch.versions or (batch.version,)]
        timing = {
            "rollout_s": batch.wall_s,
            "rollout_cpu_s": sum(t.cpu_s for t in batch.result.all()),
            "train_s": train_s,
            "train_cpu_s": time.process_time() - c1,
            "timing/wait_s": wait_s,
            "timing/trainer_busy": train_s / cycle if cycle > 0 else 1.0,
            "timing/queue_depth": float(self.source.depth),
        }
        group_stats.update(staleness_mean=statistics.fmean(lags), staleness_max=max(lags))
        self.log_step(step, batch.result, data, group_stats, train, timing, batch.policy_version)

    def log_step(
        self,
        step: int,
        result: RolloutResult,
        data: list[Datum],
        group_stats: dict[str, float],
        train: dict[str, float],
        timing: dict[str, float],
        policy_version: str,
    ) -> None:
        """The step's metric line (rollouts, groups, the update, health, timing) and the guard's tally."""
        self.budget.spend(result.all(), timing)
        metrics = {
            **step_metrics(result, self.tasks),
            **group_stats,
            **train,
            **health(result.trajectories),
            **self.watch.metrics(result.trajectories, self.family_of),
            "trained_sequences": float(len(data)),
            **timing,
        }
        self.record.log_metrics(step, metrics, policy_version=policy_version)
        for alarm in self.watch.observe(step, metrics):
            self.record.event(ALARM_EVENT, step=step, **alarm)
        if self.guard is not None:
            self.guard.after_step(step, result, metrics["reward_mean"], metrics.get(CONTRADICTED))

    # -- the loop ------------------------------------------------------------------------------

    def open_runner(self) -> RolloutRunner:
        """The run's rollout runner, for the families its tasks need, batching turns as the spec (or
        the record this run follows) says."""
        return runner_for(
            self.opened,
            self.spec,
            self.record.run_id,
            self.store.root,
            families=self.families,
            barrier=self.timing.barrier(self.record.run_id),
        )

    async def run(self, start: int, *, show_progress: bool = False) -> list[EvalPoint]:
        """Steps `start` .. the last, with eval points and checkpoints; returns the eval points run."""
        learning, points = self.learning, []
        if learning.correction == "none" and learning.pipeline.max_staleness > 0:
            self.record.event(
                "off_policy_correction_off",
                max_staleness=learning.pipeline.max_staleness,
                field="learning.correction",
            )
        self.watch = await open_watch(
            self.record,
            self.tasks,
            self.renderer,
            seed=self.spec.seed,
            alarm_steps=learning.tool_alarm_steps,
            start=start,
        )
        self.pool = open_pool(self.spec, self.record, start)
        await self.source.restore(start)
        self.refresh_policy(start)
        with progress_bar("training", show_progress) as progress:
            bar = progress.add_task("steps", total=learning.steps, completed=start)
            async with self.open_runner() as runner:
                batches = await self.executor.open(runner, self.store, self.spec, self.record)
                write_effective(self.record, effective_config(self, runner))
                sampling = asyncio.create_task(self.source.produce(batches, start))
                try:
                    self.budget = BudgetMeter.of_record(self.spec.budget, self.record)
                    for step in range(start, learning.steps + 1):
                        self.stopped = budget_stop(self.budget, self.record, step)
                        if self.stopped:
                            break
                        if step != start:
                            self.refresh_policy(step)
                        if self.eval_due(step):
                            version = self.version
                            new = await self.evaluate(
                                runner.with_sampler(version.sampler, version.provenance), step
                            )
                            points.extend(new)
                            if self.stopped or (self.guard is not None and not self.guard_points(step, new)):
                                break
                        self.versions.open(step)
                        await self.source.open_version(step)
                        if step == learning.steps:
                            break
                        waited = time.perf_counter()
                        batch = await self.source.take(step)
                        await self.train_batch(batch, time.perf_counter() - waited)
                        if self.stopped:
                            break
                        self.current = step + 1
                        progress.advance(bar)
                        if (step + 1) % learning.checkpoint_every == 0 and step + 1 < learning.steps:
                            self.save(step + 1)
                finally:
                    sampling.cancel()
                    await asyncio.gather(sampling, return_exceptions=True)
                    await self.executor.close(self.record)
        return points

    @property
    def opened(self) -> OpenedPolicy:
        """The policy the runner opens with: the newest published version."""
        version = self.version
        return OpenedPolicy(self.loaded, version.sampler, self.renderer, version.provenance)
