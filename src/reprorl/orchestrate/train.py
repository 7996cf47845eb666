"""The synchronous training loop: warm start, then sample groups, score, compute advantages, update.

One step: the current adapter samples G rollouts of each of the step's tasks (every record, failed
ones too, goes to the rollout store), groups become advantages, zero-variance groups are dropped (and
counted) if the spec says so, and one policy-gradient update is taken. The sampler reads the weights
being trained, so each sample's `policy_version` names the exact adapter state it came from. Health
metrics go to `metrics.jsonl` every step; the adapter is saved and registered at the end.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from reprorl.algos import DrGRPOAdvantage, GRPOAdvantage, PPOClip, RLOOAdvantage, TruncatedIS
from reprorl.config import RunSpec
from reprorl.config.spec import LearningSpec, LoraAdapter
from reprorl.hashing import derive_seed
from reprorl.orchestrate.launch import create_run
from reprorl.orchestrate.policies import OpenedPolicy
from reprorl.orchestrate.sample import load_taskset, runner_for, step_metrics, step_tasks
from reprorl.orchestrate.warm_start import sft_warm_start
from reprorl.policy import load_base, tensors_hash
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import LocalSampler
from reprorl.rollout.episode import Provenance
from reprorl.rollout.runner import plan_groups
from reprorl.rollout.stats import ToolStats
from reprorl.store import RunRecord, Store
from reprorl.store.rollouts import RolloutWriter
from reprorl.trainer import AdamParams, Datum, LocalTrainer, from_trajectory
from reprorl.types import Split, Termination, Trajectory

ADVANTAGES = {"grpo": GRPOAdvantage, "dr_grpo": DrGRPOAdvantage, "rloo": RLOOAdvantage}


def learning_rate(learning: LearningSpec, step: int) -> float:
    """Linear warmup, then the spec's schedule from the peak rate down to zero at the last step."""
    if step < learning.warmup_steps:
        return learning.lr * (step + 1) / learning.warmup_steps
    span = max(learning.steps - learning.warmup_steps, 1)
    progress = (step - learning.warmup_steps) / span
    if learning.schedule == "linear":
        return learning.lr * (1.0 - progress)
    if learning.schedule == "cosine":
        import math

        return learning.lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    return learning.lr


def group_data(
    trajectories: Sequence[Trajectory], learning: LearningSpec
) -> tuple[list[Datum], dict[str, float]]:
    """Advantages per group; infra failures are not the agent's and are left out."""
    advantage = ADVANTAGES[learning.advantage]()
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        if t.termination is not Termination.INFRA_ERROR and any(turn.token_ids for turn in t.turns):
            groups[t.group_id].append(t)
    data: list[Datum] = []
    zero = 0
    for members in groups.values():
        rewards = torch.tensor([m.reward.total if m.reward else 0.0 for m in members])
        if len(members) < 2 or bool((rewards == rewards[0]).all()):
            zero += 1
            if learning.drop_zero_variance_groups:
                continue
        for member, value in zip(members, advantage(rewards).tolist(), strict=True):
            data.append(from_trajectory(member, advantage=value))
    return data, {"zero_variance_groups": float(zero), "zero_variance_share": zero / max(len(groups), 1)}


def adapter_version(trainer: LocalTrainer) -> str:
    """The exact adapter weights, hashed in memory (the saved folder's hash is recorded at the end)."""
    state = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    return tensors_hash(state)


async def train_run(store: Store, spec: RunSpec, *, show_progress: bool = False) -> RunRecord:
    """Run `spec` end to end on this machine; returns the finished run record."""
    learning = spec.learning
    adapter = spec.model.adapter
    if not isinstance(adapter, LoraAdapter):
        raise NotImplementedError("full fine-tuning runs are not wired into the loop yet; use a LoRA adapter")
    tasks = load_taskset(store, str(spec.data.train)).split(Split.TRAIN)
    loaded = load_base(str(spec.model.base), store=store)
    record = create_run(spec, store)
    record.set_status("running")
    writer = RolloutWriter(record)
    try:
        started = time.perf_counter()
        if learning.sft_steps:
            warm = await sft_warm_start(
                loaded,
                tasks,
                adapter,
                record.path / "sft-adapter",
                steps=learning.sft_steps,
                seed=derive_seed(spec.seed, "sft"),
                imperfect_fraction=learning.sft_imperfect_fraction,
                on_step=lambda step, loss: record.log_metrics(step, {"sft_loss": loss}, stage="sft"),
            )
            trainer = warm.trainer
            record.event("sft_done", adapter=warm.adapter_hash, seconds=time.perf_counter() - started)
        else:
            trainer = LocalTrainer.lora(
                loaded, adapter, seed=derive_seed(spec.seed, "adapter-init"), autocast_bf16=True
            )
        trainer.model.train(False)
        renderer = ChatRenderer(loaded.tokenizer)
        sampler = LocalSampler(
            trainer.model, loaded.tokenizer, model_hash=loaded.base_hash, policy_version=""
        )
        provenance = Provenance(loaded.base_hash, None, renderer.template_hash, sampler.info())
        loss = PPOClip(learning.clip_low, learning.clip_high, TruncatedIS(learning.tis_cap), learning.kl.coef)
        opened = OpenedPolicy(loaded, sampler, renderer, provenance)
        async with runner_for(opened, spec, record.run_id) as runner:
            for step in range(learning.steps):
                sampler.policy_version = f"adapter:{adapter_version(trainer)}"
                t0 = time.perf_counter()
                jobs = plan_groups(
                    step_tasks(tasks, spec, step),
                    learning.group_size,
                    run_id=record.run_id,
                    run_seed=spec.seed,
                    step=step,
                )
                result = await runner.run(jobs)
                writer.write(step, result.all())
                rollout_s = time.perf_counter() - t0
                data, group_stats = group_data(result.trajectories, learning)
                t1 = time.perf_counter()
                train: dict[str, float] = {}
                if data:
                    train = trainer.forward_backward(data, loss)
                    train.update(trainer.optim_step(AdamParams(lr=learning_rate(learning, step))))
                metrics = {
                    **step_metrics(result),
                    **group_stats,
                    **{f"train_{k}": v for k, v in train.items()},
                    **_health(result.trajectories),
                    "rollout_s": rollout_s,
                    "train_s": time.perf_counter() - t1,
                }
                record.log_metrics(step, metrics, policy_version=sampler.policy_version)
        digest = trainer.save_adapter(record.path / "adapter")
        version = store.add(f"{spec.name}-adapter", record.path / "adapter", kind="adapter")
        record.event("adapter_saved", adapter=digest, artifact=version.label, step=learning.steps)
    except BaseException as exc:
        record.set_status("failed", error=f"{type(exc).__name__}: {exc}"[:500])
        raise
    record.set_status("succeeded")
    return record


def _health(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    stats = ToolStats().add(trajectories)
    lengths = [t.completion_tokens for t in trajectories]
    truncated = sum(any(turn.finish_reason == "length" for turn in t.turns) for t in trajectories)
    out: dict[str, Any] = {
        "response_tokens_mean": sum(lengths) / max(len(lengths), 1),
        "truncation_rate": truncated / max(len(trajectories), 1),
        **stats.as_metrics(),
    }
    return out
