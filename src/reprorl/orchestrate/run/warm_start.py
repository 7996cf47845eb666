"""The SFT warm start: oracle demonstrations, then cross-entropy steps on a fresh LoRA adapter.

Demonstrations are recorded through the model's own token path (see `reprorl.rollout.demos`), so the
warm-started policy has learned the exact rendering its RL rollouts will use. Batches are drawn with
a seeded generator; the adapter is saved as a standard peft folder.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reprorl.algos import CrossEntropy
from reprorl.config import RunSpec
from reprorl.config.spec import LoraAdapter
from reprorl.hashing import derive_seed
from reprorl.policy import LoadedModel
from reprorl.policy.chat import ChatRenderer
from reprorl.rollout.demos import collect_demonstrations
from reprorl.store import RunRecord
from reprorl.trainer import AdamParams, LocalTrainer, from_trajectory
from reprorl.trainer.schedule import Schedule, scheduled_lr
from reprorl.types import Task


@dataclass
class WarmStart:
    """The trained adapter and what it took."""

    trainer: LocalTrainer
    adapter_dir: Path
    adapter_hash: str
    demo_success: float
    losses: list[float] = field(default_factory=list)


async def sft_warm_start(
    loaded: LoadedModel,
    tasks: Sequence[Task],
    adapter: LoraAdapter,
    out_dir: Path,
    *,
    steps: int,
    batch_size: int = 8,
    lr: float = 1e-3,
    schedule: Schedule = "constant",
    seed: int = 0,
    imperfect_fraction: float = 0.0,
    autocast_bf16: bool = True,
    on_step: Callable[[int, float, float], None] | None = None,
    trainer: LocalTrainer | None = None,
) -> WarmStart:
    """Fit a new LoRA adapter on `loaded` to oracle demonstrations of `tasks`; save it to `out_dir`.

    With `trainer`, its weights (an adapter or the full model) are trained instead of a new adapter.
    """
    renderer = ChatRenderer(loaded.tokenizer)
    demos = await collect_demonstrations(
        tasks, renderer, run_id="sft", seed=seed, imperfect_fraction=imperfect_fraction
    )
    data = [from_trajectory(d) for d in demos]
    if trainer is None:
        trainer = LocalTrainer.lora(
            loaded, adapter, seed=derive_seed(seed, "adapter-init"), autocast_bf16=autocast_bf16
        )
    rng = random.Random(derive_seed(seed, "sft-batches"))
    losses = []
    for step in range(steps):
        batch = rng.sample(data, min(batch_size, len(data)))
        losses.append(trainer.forward_backward(batch, CrossEntropy())["loss"])
        rate = scheduled_lr(lr, step, steps, schedule)
        trainer.optim_step(AdamParams(lr=rate))
        if on_step is not None:
            on_step(step, losses[-1], rate)
    digest = trainer.save_adapter(out_dir)
    success = sum(1.0 for d in demos if d.reward and d.reward.success) / max(len(demos), 1)
    return WarmStart(trainer, out_dir, digest, success, losses)


async def warm_start_run(
    record: RunRecord, spec: RunSpec, loaded: LoadedModel, tasks: Sequence[Task], trainer: LocalTrainer
) -> None:
    """A run's SFT warm start (`learning.sft_steps`): its own trainer fitted to oracle demonstrations
    of its train tasks, each step's loss logged (`stage = "sft"`), and an `sft_done` event."""
    learning, started = spec.learning, time.perf_counter()
    shutil.rmtree(record.path / "sft-adapter", ignore_errors=True)  # a killed earlier attempt
    demonstrated = demonstrated_tasks(tasks, learning.sft_demonstrations, spec.seed)
    rl_temperature = trainer.temperature
    trainer.temperature = learning.sft_temperature
    try:
        warm = await sft_warm_start(
            loaded,
            demonstrated,
            LoraAdapter(),  # unused: the run's own trainer is passed in
            record.path / "sft-adapter",
            steps=learning.sft_steps,
            batch_size=learning.sft_batch_size,
            lr=learning.sft_lr,
            schedule=learning.sft_schedule,
            seed=derive_seed(spec.seed, "sft"),
            imperfect_fraction=learning.sft_imperfect_fraction,
            on_step=_step_logger(record),
            trainer=trainer,
        )
        fitted_at = trainer.temperature
    finally:
        trainer.temperature = rl_temperature
    record.event(
        "sft_done",
        adapter=warm.adapter_hash,
        seconds=time.perf_counter() - started,
        demonstrated=[t.id for t in demonstrated],
        temperature=fitted_at,
    )


def demonstrated_tasks(tasks: Sequence[Task], count: int | None, seed: int) -> list[Task]:
    """The train tasks the warm start demonstrates (`learning.sft_demonstrations`): all of them, or
    `count` drawn with the run's seed, in the train set's order. A train set of several families
    gives each a share of `count` in proportion to its tasks (largest remainders first), drawn from
    its own tasks (an unstratified draw of 192 from 256 tasks per family gave calculator and files
    68 each and sql 56)."""
    if count is None:
        return list(tasks)
    if count > len(tasks):  # refused before the run's record is made (`check_demonstrations`)
        raise ValueError(f"{count} demonstrations asked for, of {len(tasks)} train tasks")
    families: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        families.setdefault(task.family, []).append(i)
    if len(families) == 1:
        picked = set(random.Random(derive_seed(seed, "sft-demonstrations")).sample(range(len(tasks)), count))
        return [t for i, t in enumerate(tasks) if i in picked]
    exact = {f: count * len(ids) / len(tasks) for f, ids in families.items()}
    quota = {f: int(x) for f, x in exact.items()}
    for f in sorted(exact, key=lambda f: (quota[f] - exact[f], f))[: count - sum(quota.values())]:
        quota[f] += 1
    picked = set()
    for f, ids in sorted(families.items()):
        picked.update(random.Random(derive_seed(seed, "sft-demonstrations", f)).sample(ids, quota[f]))
    return [t for i, t in enumerate(tasks) if i in picked]


def _step_logger(record: RunRecord) -> Callable[[int, float, float], None]:
    """Log each SFT step's loss and learning rate with the wall and CPU seconds it took (what an
    equal-compute control of the RL steps is measured in); step 0's include collecting the
    demonstrations."""
    last = [time.perf_counter(), time.process_time()]

    def log(step: int, loss: float, lr: float) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        figures = {"sft_loss": loss, "sft_lr": lr, "sft_s": wall - last[0], "sft_cpu_s": cpu - last[1]}
        last[:] = [wall, cpu]
        record.log_metrics(step, figures, stage="sft")

    return log
