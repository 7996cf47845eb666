"""The sampling job: the rollout half of a run spec, recorded as a run — groups of the policy on its tasks.

`reprorl sample SPEC` runs the spec's policy on its train tasks for some steps without training:
each step draws `tasks_per_step` tasks (a seeded shuffle) and G rollouts of each, and stores every
trajectory, failed attempts included, under the run. It is how a baseline is recorded. With
`data.screen` the draws rest the tasks whose groups showed no signal, as in training, and the tasks
that last showed signal are registered at the end (a screen in one pass over the steps).
"""

from __future__ import annotations

import asyncio

from reprorl.config import RunSpec
from reprorl.errors import UserInputError
from reprorl.orchestrate.run.judge_reward import check_judge, record_judge
from reprorl.orchestrate.run.launch import create_run
from reprorl.orchestrate.run.policies import chat_template_text, kept_bytes, open_policy
from reprorl.orchestrate.run.rollouts import load_taskset, progress_bar, runner_for, step_metrics, step_tasks
from reprorl.orchestrate.run.signal_pool import observe_step, open_pool, register_signal_tasks
from reprorl.rollout.runner import plan_groups
from reprorl.store import RunRecord, Store
from reprorl.store.rollouts import RolloutWriter
from reprorl.types import Split


async def sample_run(store: Store, spec: RunSpec, *, steps: int, show_progress: bool = True) -> RunRecord:
    """Record a run of `spec`'s policy on its train tasks for `steps` steps (no training)."""
    tasks = load_taskset(store, str(spec.data.train)).split(Split.TRAIN)
    if not tasks:
        raise ValueError(f"data.train: {spec.data.train} has no train-split tasks")
    if spec.model.vllm is not None:
        raise UserInputError(
            "model.vllm is a training run's rollout engine; `reprorl sample` samples in this process "
            "or through model.inference (a vLLM server's URL and model name)",
            field="model.vllm",
        )
    init = spec.model.init_adapter
    opened = open_policy(
        store,
        str(spec.model.base),
        adapter=str(init) if init else None,
        dtype=spec.model.sampling_dtype,
        keep_bytes=kept_bytes(spec),
        inference=spec.model.inference,
        chat_template=chat_template_text(store, spec),
    )
    judge = check_judge(store, spec)
    record = create_run(spec, store)
    record_judge(record, judge)
    record.set_status("running")
    writer = RolloutWriter(record)
    pool = open_pool(spec, record, 0)
    total = steps * min(spec.learning.tasks_per_step, len(tasks)) * spec.learning.group_size
    try:
        with progress_bar("sampling", show_progress) as progress:
            bar = progress.add_task("rollouts", total=total)
            families = {t.family for t in tasks}
            async with runner_for(opened, spec, record.run_id, store.root, families=families) as runner:
                for step in range(steps):
                    resting = pool.resting(step) if pool is not None else None
                    jobs = plan_groups(
                        step_tasks(tasks, spec, step, resting),
                        spec.learning.group_size,
                        run_id=record.run_id,
                        run_seed=spec.seed,
                        step=step,
                    )
                    result = await runner.run(jobs, on_done=lambda _: progress.advance(bar))
                    writer.write(step, result.all())
                    screened = observe_step(pool, record, step, result.trajectories) if pool else {}
                    record.log_metrics(step, {**step_metrics(result, tasks), **screened})
            if pool is not None:
                register_signal_tasks(store, spec, record, pool, tasks)
    except BaseException as exc:
        record.set_status("failed", error=f"{type(exc).__name__}: {exc}"[:500])
        raise
    record.set_status("succeeded")
    return record


def sample_run_sync(store: Store, spec: RunSpec, *, steps: int, show_progress: bool = True) -> RunRecord:
    return asyncio.run(sample_run(store, spec, steps=steps, show_progress=show_progress))
