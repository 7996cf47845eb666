"""A training run end to end: preflight, record, warm start or resume, the loop, the saved adapter.

`train_run` builds the one training loop from its parts — the spec's source of batches, an
executor (this process, or Ray actors with `ray`), and a timing (live, or a recorded run's,
followed) — and gives it its frame: the leakage gate before anything is written, the SFT warm start
or the newest intact checkpoint, and at the end the trained weights saved and registered with what
they depend on.
"""

from __future__ import annotations

import contextlib
import shutil
from typing import Any

from reprorl.config import RunSpec
from reprorl.errors import UserInputError
from reprorl.orchestrate.pipeline.executors import LocalExecutor
from reprorl.orchestrate.pipeline.loop import TrainLoop
from reprorl.orchestrate.pipeline.ray_engine import ray_launch
from reprorl.orchestrate.pipeline.ray_workers import RayExecutor, connect_ray
from reprorl.orchestrate.pipeline.steps import ewma_of, make_loss
from reprorl.orchestrate.pipeline.timing import LiveTiming, RecordedTiming, Timing
from reprorl.orchestrate.run.checkpoint import rewind
from reprorl.orchestrate.run.damage import resume_point
from reprorl.orchestrate.run.engine import check_engine, open_engine
from reprorl.orchestrate.run.exhaustion import CallbackExhaustion, exhausted
from reprorl.orchestrate.run.judge_reward import check_judge, record_judge
from reprorl.orchestrate.run.launch import create_run
from reprorl.orchestrate.run.policies import chat_template_text, load_run_base
from reprorl.orchestrate.run.preflight import (
    check_demonstrations,
    check_family_weights,
    check_run_leakage,
    record_leakage,
)
from reprorl.orchestrate.run.setup import build_trainer
from reprorl.orchestrate.run.signal_pool import register_signal_tasks
from reprorl.store import RunRecord, Store
from reprorl.store.compaction import check_resumable
from reprorl.trainer import LocalTrainer
from reprorl.trainer.device import device_info, make_deterministic


async def train_run(
    store: Store,
    spec: RunSpec,
    *,
    resume: RunRecord | None = None,
    created: RunRecord | None = None,
    show_progress: bool = False,
    ray: str | None = None,
    timing: Timing | None = None,
) -> RunRecord:
    """Run `spec` end to end, or continue `resume` (a run of it) from its checkpoint.

    With `ray` (a cluster address, or "local" to start one here) the rollout workers are Ray actors.
    `created` is a fresh record `prepare_run` wrote for it (the Ray trainer actor trains one of those).
    `timing`: live by default; a `RecordedTiming` makes a recorded run's timing-dependent decisions
    the same way again.
    """
    if isinstance(timing, RecordedTiming) and (ray is not None or resume is not None):
        raise ValueError("a recorded schedule is followed by a fresh run in this process (no Ray, no resume)")
    check_engine(spec, ray=ray)
    if resume is not None:
        check_resumable(resume)
    record = resume or created or prepare_run(store, spec)
    record.set_status("running")
    engine = None
    with CallbackExhaustion() as watch:
        try:
            loaded = load_run_base(store, spec)
            trainer = build_trainer(store, loaded, spec)
            determinism = (
                make_deterministic(trainer.device)
                if spec.learning.deterministic_cuda
                else {"deterministic": False}
            )
            record.event(
                "trainer_device",
                **device_info(trainer.device, autocast_bf16=trainer.autocast_bf16),
                **determinism,
            )
            ewma = ewma_of(make_loss(spec.learning), trainer)
            executor = RayExecutor(ray) if ray is not None else LocalExecutor()
            launch = None
            if ray is not None and spec.model.vllm is not None and not spec.model.vllm.urls:
                cluster = connect_ray(ray, spec.learning.pipeline.workers)
                launch = ray_launch(cluster, spec.model.vllm, record.run_id, record.path / "engine" / "logs")
            engine = open_engine(store, spec, record, loaded, launch=launch)
            loop = TrainLoop(
                store,
                spec,
                record,
                loaded,
                trainer,
                ewma,
                executor=executor,
                timing=timing or LiveTiming(),
                engine=engine,
            )
            start, checkpoint = 0, None
            if resume is not None:
                checkpoint, keep = resume_point(record, loop.keep_on_resume)
                start = rewind(record, checkpoint, keep=keep)
                named = checkpoint.path.name if checkpoint else None
                record.event("resumed", from_step=start, checkpoint=named)
            if checkpoint is not None:
                loop.load(checkpoint.path)  # the pinned KL reference included
            else:
                if spec.learning.sft_steps:
                    await loop.warm_start()
                    # RL starts with fresh moments: SFT's squared gradients would shrink RL's steps
                    # for hundreds of updates (β2 = 0.999).
                    trainer.reset_optimizer()
                    if ewma is not None:
                        ewma = loop.ewma = ewma_of(loop.loss, trainer)
                if spec.learning.kl.reference == "initial":
                    record.event("kl_reference", version=trainer.pin_reference(), step=0)
                if spec.learning.sft_steps:
                    loop.save(0)
            await loop.run(start, show_progress=show_progress)
            if loop.pool is not None:
                register_signal_tasks(store, spec, record, loop.pool, loop.tasks)
            if loop.stopped is None:
                finish(store, spec, record, trainer)
        except BaseException as exc:
            # A callback's exhaustion cancels the run's task: the run fails with that error.
            cause = watch.error or exc
            failure = exhausted(cause, record.run_id, str(store.root))
            with contextlib.suppress(OSError):  # a full disk may refuse the status file too
                record.set_status("failed", error=f"{type(cause).__name__}: {failure or cause}"[:500])
            if failure is not None and failure is not exc:
                raise failure from exc
            raise
        finally:
            if engine is not None:
                engine.close()
    if loop.stopped is not None:
        record.set_status("stopped", reason=loop.stopped)
    else:
        record.set_status("succeeded")
    return record


def prepare_run(store: Store, spec: RunSpec) -> RunRecord:
    """The record of a new run of `spec`, written only once the leakage and judge gates let it through."""
    if spec.model.inference is not None:
        raise UserInputError(
            "training samples from the weights it is training, in this process; a remote server "
            "cannot be sent them, so remove model.inference (it serves `reprorl sample`)",
            field="model.inference",
        )
    leakage = check_run_leakage(store, spec)
    check_family_weights(store, spec)
    check_demonstrations(store, spec)
    judge = check_judge(store, spec)
    chat_template_text(store, spec)  # a template that cannot be read is refused before any record
    record = create_run(spec, store)
    record_leakage(record, leakage)
    record_judge(record, judge)
    return record


def finish(store: Store, spec: RunSpec, record: RunRecord, trainer: LocalTrainer) -> None:
    """Save the trained weights as a standard folder and register them with what they depend on."""
    folder = record.path / "adapter"
    shutil.rmtree(folder, ignore_errors=True)  # a killed earlier attempt at this very save
    digest = trainer.save_adapter(folder)
    adapter = spec.model.adapter
    meta: dict[str, Any] = {
        "base_model": trainer.base_hash,
        "adapter": adapter.model_dump(mode="json"),
        "lr": spec.learning.lr,
        "loss": spec.learning.loss.kind,
        "train_taskset": store.resolve(str(spec.data.train)).hash,
        "step": spec.learning.steps,
        "run_id": record.run_id,
        "spec_hash": spec.spec_hash(),
    }
    version = store.add(f"{spec.name}-adapter", folder, kind="adapter", meta=meta)
    store.registry.link(version.hash, trainer.base_hash, "adapter_of", run_id=record.run_id)
    record.event("adapter_saved", adapter=digest, artifact=version.label, step=spec.learning.steps)
