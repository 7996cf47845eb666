"""The synchronous training loop: sample groups, score, compute advantages, update — checkpointed.

One step: the current weights sample G rollouts of each of the step's tasks (every record, failed
ones too, goes to the rollout store), groups become advantages, zero-variance groups are dropped (and
counted) if the spec says so, and one policy-gradient update is taken. The sampler reads the weights
being trained, so each sample's `policy_version` names the exact state it came from. Eval points on
the spec's frozen suites come before the first step, every `evaluation.every_steps`, and after the
last. Health metrics go to `metrics.jsonl` every step, a checkpoint follows every
`learning.checkpoint_every` steps, and a killed run resumes from its newest checkpoint exactly.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from reprorl.config import RunSpec
from reprorl.config.spec import LoraAdapter
from reprorl.evaluation.point import EvalPoint, evaluate
from reprorl.hashing import derive_seed
from reprorl.orchestrate.budget import BudgetMeter
from reprorl.orchestrate.checkpoint import (
    GOOD_PREFIX,
    Checkpoint,
    LoopState,
    good_checkpoint,
    save_checkpoint,
)
from reprorl.orchestrate.effective import effective_config, write_effective
from reprorl.orchestrate.guarding import LoopGuard
from reprorl.orchestrate.integrity import CONTRADICTED
from reprorl.orchestrate.kept_versions import VersionKeeper
from reprorl.orchestrate.policies import OpenedPolicy
from reprorl.orchestrate.sample import load_taskset, progress_bar, runner_for, step_metrics, step_tasks
from reprorl.orchestrate.setup import eval_suites
from reprorl.orchestrate.steps import group_data, health, learning_rate, make_loss, prepare
from reprorl.orchestrate.versions import trained_version
from reprorl.orchestrate.warm_start import sft_warm_start
from reprorl.policy import LoadedModel
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import LocalSampler
from reprorl.rollout.episode import Provenance
from reprorl.rollout.recorded_batches import RecordedBarrier
from reprorl.rollout.runner import Barrier, RolloutJob, RolloutResult, RolloutRunner, plan_groups
from reprorl.rollout.scoring import EXCLUDED, exclusion_metrics
from reprorl.store import RunRecord, Store
from reprorl.store.rollouts import RolloutWriter
from reprorl.trainer import AdamParams, Datum, EWMAWeights, LocalTrainer
from reprorl.trainer.snapshot import SamplingSnapshot
from reprorl.types import Split, Trajectory

if TYPE_CHECKING:
    from reprorl.orchestrate.schedule_replay import RecordedSchedule

EWMA_FILE = "ewma.pt"


class TrainLoop:
    """One run's loop state: trainer, sampler, runner, record; `run()` takes it from its cursor to the end."""

    def __init__(
        self,
        store: Store,
        spec: RunSpec,
        record: RunRecord,
        loaded: LoadedModel,
        trainer: LocalTrainer,
        ewma: EWMAWeights | None,
    ) -> None:
        self.store, self.spec, self.record, self.loaded = store, spec, record, loaded
        self.trainer, self.ewma = trainer, ewma
        self.learning = spec.learning
        taskset = load_taskset(store, str(spec.data.train))
        self.train_version = taskset.version  # the content hash of the tasks the loop draws from
        self.tasks = taskset.split(Split.TRAIN)
        if not self.tasks:
            raise ValueError(f"data.train: {spec.data.train} has no train-split tasks")
        self.suites = eval_suites(store, spec)
        # The env families the run's tasks need: what its sandboxes load tools for.
        self.families = sorted(
            {t.family for t in self.tasks} | {t.family for s in self.suites for t in s.tasks}
        )
        self.writer = RolloutWriter(record)
        self.loss = make_loss(self.learning)
        self.renderer = ChatRenderer(loaded.tokenizer)
        self.dtype: torch.dtype = getattr(torch, spec.model.sampling_dtype)
        self.guard = (
            LoopGuard(spec, {s.name: s.tasks for s in self.suites}) if spec.evaluation.rollback else None
        )
        self.stopped: str | None = None  # why a rollback rule ended the run early
        self.barrier: Barrier | None = None  # which turns share a sampling batch; None: the spec's
        self.keeper = VersionKeeper(record)  # every version sampled from, so each rollout replays
        self.budget = BudgetMeter(spec.budget)  # what was spent; `run()` reads it from the record
        self.open_sampling()

    def follow(self, schedule: RecordedSchedule) -> None:
        """Decide what timing decided in a recorded run as its record says (a reproduction)."""
        if schedule.turns is not None:
            self.barrier = RecordedBarrier(schedule.turns, self.record.run_id)

    def open_sampling(self) -> None:
        """The rollout side: one copy of the trained weights, refreshed before every step."""
        self.snapshot = SamplingSnapshot(self.trainer, self.dtype)
        self.sampler = LocalSampler(
            self.snapshot.model, self.loaded.tokenizer, model_hash=self.loaded.base_hash, policy_version=""
        )
        provenance = Provenance(self.loaded.base_hash, None, self.renderer.template_hash, self.sampler.info())
        self.opened = OpenedPolicy(self.loaded, self.sampler, self.renderer, provenance)

    def refresh_policy(self, step: int) -> None:
        """Let the rollout side sample from the trainer's weights as they are now (before `step`)."""
        self.snapshot.refresh()
        tensors = self.trainer.trainable_state()
        self.sampler.policy_version = trained_version(self.trainer, tensors)
        self.keeper.keep(self.sampler.policy_version, tensors, step=step)

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

    def keep_on_resume(self, record: RunRecord, checkpoint: Checkpoint) -> frozenset[str]:
        """Rollout parts past `checkpoint` that a resume keeps: none, every step samples anew."""
        return frozenset()

    def load(self, folder: Path, *, guard: bool = True) -> None:
        """Take the trained weights, optimizer, RNG (and EWMA, guard) state of a checkpoint folder."""
        self.trainer.load_state(folder)
        if self.ewma is not None:
            self.ewma.load_state_dict(torch.load(folder / EWMA_FILE, weights_only=True))
        if guard and self.guard is not None:
            self.guard.load(folder)

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
        learning, started = self.learning, time.perf_counter()
        shutil.rmtree(self.record.path / "sft-adapter", ignore_errors=True)  # a killed earlier attempt
        warm = await sft_warm_start(
            self.loaded,
            self.tasks,
            LoraAdapter(),  # unused: the run's own trainer is passed in
            self.record.path / "sft-adapter",
            steps=learning.sft_steps,
            batch_size=learning.sft_batch_size,
            lr=learning.sft_lr,
            seed=derive_seed(self.spec.seed, "sft"),
            imperfect_fraction=learning.sft_imperfect_fraction,
            on_step=lambda step, loss: self.record.log_metrics(step, {"sft_loss": loss}, stage="sft"),
            trainer=self.trainer,
        )
        self.record.event("sft_done", adapter=warm.adapter_hash, seconds=time.perf_counter() - started)

    def budget_stop(self, step: int) -> bool:
        """Stop the run once it has spent one of `budget`'s caps (checked before each step and eval)."""
        reached = self.budget.reached()
        if reached is None:
            return False
        field, why = reached
        self.stopped = f"{why} (before step {step})"
        self.record.event(
            "stopped_by_rule", step=step, rules=[field], action="stop", spent=self.budget.figures()
        )
        return True

    def unscored_stop(self, step: int, trajectories: Sequence[Trajectory], where: str) -> bool:
        """Stop the run when more of these rollouts went unscored than `evaluation.max_unscored_share`
        allows: what is left is no fair sample of the policy (the verifier may fail on one kind of
        answer only), so it is neither trained on nor taken as a measurement."""
        limit = self.spec.evaluation.max_unscored_share
        figures = exclusion_metrics(trajectories)
        share = figures["unscored_share"]
        if limit is None or share <= limit:
            return False
        classes = {
            k.removeprefix(EXCLUDED): int(v) for k, v in figures.items() if k.startswith(EXCLUDED) and v
        }
        self.stopped = (
            f"evaluation.max_unscored_share: {share:.0%} of the {where} rollouts of step {step} were "
            f"unscored ({', '.join(f'{k} {n}' for k, n in sorted(classes.items()))}), more than {limit:g}"
        )
        self.record.event(
            "stopped_by_rule",
            step=step,
            rules=["max_unscored_share"],
            action="stop",
            where=where,
            unscored_share=share,
            limit=limit,
            excluded=classes,
        )
        return True

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
            if self.unscored_stop(step, point.result.trajectories, f"eval {suite.name}"):
                break
        return points

    def open_runner(self) -> RolloutRunner:
        """The run's rollout runner, for the families its tasks need, batching turns as the spec (or
        the record this run follows) says."""
        return runner_for(
            self.opened,
            self.spec,
            self.record.run_id,
            self.store.root,
            families=self.families,
            barrier=self.barrier,
        )

    def eval_due(self, step: int) -> bool:
        every = self.spec.evaluation.every_steps
        return step == 0 or step == self.learning.steps or step % every == 0

    def plan(self, step: int) -> list[RolloutJob]:
        """The groups of step `step`: its seeded tasks, G members each, with derived seeds."""
        return plan_groups(
            step_tasks(self.tasks, self.spec, step),
            self.learning.group_size,
            run_id=self.record.run_id,
            run_seed=self.spec.seed,
            step=step,
        )

    async def step(self, runner: RolloutRunner, step: int) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        result = await runner.run(self.plan(step))
        self.writer.write(step, result.all())
        timing = {"rollout_s": time.perf_counter() - t0, "rollout_cpu_s": time.process_time() - c0}
        data, group_stats = group_data(result.trajectories, self.learning)
        if self.unscored_stop(step, result.trajectories, "training"):
            data = []
        t1, c1 = time.perf_counter(), time.process_time()
        train = self.update(data, step)
        timing.update(train_s=time.perf_counter() - t1, train_cpu_s=time.process_time() - c1)
        self.log_step(step, result, data, group_stats, train, timing, self.sampler.policy_version)

    def update(self, data: list[Datum], step: int) -> dict[str, float]:
        """One optimizer step on `data` (none without data); the loss's and optimizer's figures."""
        if not data:
            return {}
        learning = self.learning
        data = prepare(self.trainer, data, learning, self.ewma)
        train = self.trainer.forward_backward(data, self.loss)
        train.update(self.trainer.optim_step(AdamParams(lr=learning_rate(learning, step))))
        if self.ewma is not None:
            self.ewma.update()
        return {f"train/{k}": v for k, v in train.items()}

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
            "trained_sequences": float(len(data)),
            **timing,
        }
        self.record.log_metrics(step, metrics, policy_version=policy_version)
        if self.guard is not None:
            self.guard.after_step(step, result, metrics["reward_mean"], metrics.get(CONTRADICTED))

    async def run(self, start: int, *, show_progress: bool = False) -> list[EvalPoint]:
        """Steps `start` .. the last, with eval points and checkpoints; returns the eval points run."""
        learning, points = self.learning, []
        with progress_bar("training", show_progress) as progress:
            bar = progress.add_task("steps", total=learning.steps, completed=start)
            async with self.open_runner() as runner:
                write_effective(self.record, effective_config(self, runner))
                self.budget = BudgetMeter.of_record(self.spec.budget, self.record)
                for step in range(start, learning.steps + 1):
                    if self.budget_stop(step):
                        break
                    self.refresh_policy(step)
                    if self.eval_due(step):
                        new = await self.evaluate(runner, step)
                        points.extend(new)
                        if self.stopped or (self.guard is not None and not self.guard_points(step, new)):
                            break
                    if step == learning.steps:
                        break
                    await self.step(runner, step)
                    progress.advance(bar)
                    if self.stopped:
                        break
                    if (step + 1) % learning.checkpoint_every == 0 and step + 1 < learning.steps:
                        self.save(step + 1)
        return points
