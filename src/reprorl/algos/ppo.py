"""PPO's clipped objective (Schulman et al. 2017), decoupled (Hilton et al. 2021), with clip-higher.

With r̃ = π_θ/π_prox per token, Â the sequence's advantage, asymmetric bounds ε_low, ε_high
(Yu et al. 2025, DAPO: "clip-higher", 0.2 / 0.28) and importance weights w ≈ π_prox/μ on tokens
sampled by the behaviour policy μ (see `importance.py`):

    L(θ) = −(1/N) Σ_{b,t} m_{b,t} · w_{b,t} · min(r̃ Â, clip(r̃, 1 − ε_low, 1 + ε_high) Â)
           + β · (1/N) Σ m · k2(π_θ, π_ref)

averaged over tokens (N = Σ m: every token weighs the same, whatever its sequence's length). π_prox
defaults to sg(π_θ), the trainer's own logprobs before the update: with one update per batch that is
the policy that sampled, computed by the trainer, so r̃ = 1 and w = π_θ/μ corrects only the sampler's
numerics (another precision, other kernels), which `mismatch_k3` measures. The KL penalty uses k2's
gradient and reports k3 (see `kl.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from reprorl.algos.base import LossOutput, TokenBatch, masked_mean
from reprorl.algos.importance import Corrected, Correction, token_weight_metrics
from reprorl.algos.kl import kl_penalty
from reprorl.algos.registered import LossShared, register_loss
from reprorl.config.loss import LossConfig, Mean

if TYPE_CHECKING:
    import torch
else:
    from reprorl.algos.tensors import torch  # imported on first use


class ClipBounds(LossConfig):
    """The trust region of a clipped ratio: r is kept within [1 − clip_low, 1 + clip_high]."""

    clip_low: float = Field(default=0.2, gt=0.0, lt=1.0, description="Clip epsilon below 1 (ε_low).")
    clip_high: float = Field(
        default=0.28, gt=0.0, description="Clip epsilon above 1 (ε_high; DAPO's clip-higher)."
    )


class PPOClipConfig(ClipBounds):
    """`kind = "ppo_clip"`: PPO clip against the pre-update weights, token-level mean."""

    kind: Literal["ppo_clip"] = "ppo_clip"


class PPOClip(Corrected):
    """The clipped surrogate with asymmetric bounds, token-level mean, IS-corrected."""

    name = "ppo_clip"
    mean: Mean = "token"

    def __init__(
        self,
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        correction: Correction | None = None,
        kl_coef: float = 0.0,
        kl_estimator: str = "k2",
    ) -> None:
        super().__init__(correction, kl_coef, kl_estimator)
        self.clip_low, self.clip_high = clip_low, clip_high

    def __call__(self, logprobs: torch.Tensor, batch: TokenBatch) -> LossOutput:
        mask = batch.mask
        behaviour = batch.behaviour_logprobs
        proximal = batch.proximal_logprobs if batch.proximal_logprobs is not None else logprobs.detach()
        advantages = batch.advantages[:, None].expand_as(logprobs)
        ratio = torch.exp(logprobs - proximal)
        clipped = ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)
        surrogate = torch.minimum(ratio * advantages, clipped * advantages)
        weights = self.correction(proximal, behaviour)
        loss = -masked_mean(weights * surrogate, mask)
        metrics = {
            "pg_loss": float(loss.detach()),
            "clip_frac_high": float(
                masked_mean(((ratio > 1 + self.clip_high) & (advantages > 0)).float(), mask)
            ),
            "clip_frac_low": float(
                masked_mean(((ratio < 1 - self.clip_low) & (advantages < 0)).float(), mask)
            ),
            # The raw ratio before the correction: how far off-policy the worst token was.
            "is_ratio_max": float((torch.exp(proximal - behaviour) * mask).max()) if mask.any() else 0.0,
            **token_weight_metrics(weights, proximal, behaviour, mask),
        }
        loss = kl_penalty(loss, logprobs, batch, self.kl_coef, metrics, self.kl_estimator)
        metrics["loss"] = float(loss.detach())
        return LossOutput(loss, metrics)


@register_loss(PPOClipConfig)
def ppo_clip(config: PPOClipConfig, shared: LossShared) -> PPOClip:
    return PPOClip(config.clip_low, config.clip_high, shared.correction, shared.kl_coef, shared.kl_estimator)
