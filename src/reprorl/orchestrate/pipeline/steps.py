"""One policy-gradient step's parts: the learning-rate schedule, group advantages, the loss, health metrics.

Kept apart from the loop so that each part can be checked alone and reused by other loops (async
training drives the same pieces with another schedule).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from reprorl.algos import (
    Correction,
    Loss,
    LossShared,
    MaskedIS,
    NoCorrection,
    TruncatedIS,
    build_loss,
)
from reprorl.config.advantage import ADVANTAGES
from reprorl.config.spec import LearningSpec
from reprorl.rollout.scoring import counted
from reprorl.rollout.stats import ToolStats
from reprorl.trainer import Datum, LocalTrainer, sequences, with_logprobs
from reprorl.trainer.ewma import EWMAWeights
from reprorl.trainer.schedule import scheduled_lr
from reprorl.types import Trajectory


def learning_rate(learning: LearningSpec, step: int) -> float:
    """Linear warmup, then the spec's schedule from the peak rate down to zero at the last step."""
    return scheduled_lr(learning.lr, step, learning.steps, learning.schedule, learning.warmup_steps)


def correction_of(learning: LearningSpec) -> Correction:
    """The spec's importance correction of behaviour (sampled) tokens toward the proximal policy."""
    if learning.correction == "none":
        return NoCorrection()
    return (MaskedIS if learning.correction == "mis" else TruncatedIS)(learning.tis_cap)


def make_loss(learning: LearningSpec) -> Loss:
    """The objective `learning.loss` selects, with the spec's importance correction and KL penalty."""
    # "off" comes with coef 0 (the spec refuses anything else), where no estimator is computed.
    estimator = "k2" if learning.kl.estimator == "off" else learning.kl.estimator
    return build_loss(learning.loss, LossShared(correction_of(learning), learning.kl.coef, estimator))


def ewma_of(loss: Loss, trainer: LocalTrainer) -> EWMAWeights | None:
    """The moving average of the weights that gives a loss its proximal policy, where it asks for one."""
    decay = getattr(loss, "ewma_decay", None)
    return EWMAWeights(trainer.params, float(decay)) if decay is not None else None


def group_data(
    trajectories: Sequence[Trajectory], learning: LearningSpec
) -> tuple[list[Datum], dict[str, float]]:
    """Advantages per group, over the rollouts that count (`reprorl.types.exclusion`): a rollout the
    platform, verifier or judge failed is left out of its group, so no advantage is computed from it."""
    advantage = ADVANTAGES.get_part(learning.advantage, "learning.advantage")()
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in counted(trajectories):
        if any(turn.token_ids for turn in t.turns):
            groups[t.group_id].append(t)
    data: list[Datum] = []
    zero = 0
    for members in groups.values():
        rewards = torch.tensor([m.reward.total for m in members if m.reward is not None])
        if len(members) < 2 or bool((rewards == rewards[0]).all()):
            zero += 1
            if learning.drop_zero_variance_groups:
                continue
        for member, value in zip(members, advantage(rewards).tolist(), strict=True):
            data.extend(sequences(member, advantage=value))
    return data, {"zero_variance_groups": float(zero), "zero_variance_share": zero / max(len(groups), 1)}


def prepare(
    trainer: LocalTrainer, data: list[Datum], loss: Loss, ewma: EWMAWeights | None, *, reference: bool = True
) -> list[Datum]:
    """Attach what the loss reads besides the behaviour logprobs: π_prox (EWMA) and π_ref (for KL).

    The reference logprobs are computed where `reference` says (`KLPenalty.measured_at`): every step
    with a KL term, where they enter the loss, and every `monitor_every` steps without, where KL to
    the base is a health metric. Only the rows the trainer runs (`rows_to_run`) get them.
    """
    run = trainer.rows_to_run(data, loss)
    live = [data[i] for i in run]
    proximal = ewma.proximal_logprobs(trainer, live) if ewma is not None and live else None
    base = trainer.reference_logprobs(live) if reference and trainer.reference_available and live else None
    out = list(data)
    for i, d in zip(run, with_logprobs(live, proximal=proximal, reference=base), strict=True):
        out[i] = d
    return out


def health(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Rollout-side health: response length, truncation, tool failures by tool and class, tool usage."""
    stats = ToolStats().add(trajectories)
    lengths = [t.completion_tokens for t in trajectories]
    truncated = sum(any(turn.finish_reason == "length" for turn in t.turns) for t in trajectories)
    components: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        for name, value in (t.reward.components if t.reward else {}).items():
            components[name].append(value)
    model_s = [sum(turn.sample_s for turn in t.turns) for t in trajectories]
    env_s = [sum(turn.tool_s for turn in t.turns) for t in trajectories]
    return {
        "response_tokens_mean": statistics.fmean(lengths) if lengths else 0.0,
        "truncation_rate": truncated / max(len(trajectories), 1),
        "turns_mean": statistics.fmean(len(t.turns) for t in trajectories) if trajectories else 0.0,
        **{f"reward/{name}": statistics.fmean(v) for name, v in sorted(components.items())},
        **stats.as_metrics(),
        # Where an episode's time went: sampling its turns, or waiting on its tools and env.
        "timing/episode_model_s": statistics.fmean(model_s) if model_s else 0.0,
        "timing/episode_env_s": statistics.fmean(env_s) if env_s else 0.0,
        "timing/env_share": sum(env_s) / max(sum(env_s) + sum(model_s), 1e-9),
    }
