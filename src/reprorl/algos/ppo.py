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

import torch

from reprorl.algos.base import LossOutput, TokenBatch, masked_mean
from reprorl.algos.importance import Correction, TruncatedIS
from reprorl.algos.kl import k3, kl_penalty


class PPOClip:
    """The clipped surrogate with asymmetric bounds, token-level mean, IS-corrected."""

    name = "ppo_clip"

    def __init__(
        self,
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        correction: Correction | None = None,
        kl_coef: float = 0.0,
        kl_estimator: str = "k2",
    ) -> None:
        self.clip_low, self.clip_high = clip_low, clip_high
        self.correction = correction or TruncatedIS(2.0)
        self.kl_coef, self.kl_estimator = kl_coef, kl_estimator

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
            "is_weight_mean": float(masked_mean(weights, mask)),
            "is_weight_max": float((weights * mask).max()) if mask.any() else 0.0,
            "is_weight_min": float(weights[mask.bool()].min()) if mask.any() else 0.0,
            # The raw ratio before the correction: how far off-policy the worst token was.
            "is_ratio_max": float((torch.exp(proximal - behaviour) * mask).max()) if mask.any() else 0.0,
            "mismatch_k3": float(masked_mean(k3(proximal, behaviour), mask)),
            "tokens": float(mask.sum()),
        }
        loss = kl_penalty(loss, logprobs, batch, self.kl_coef, metrics, self.kl_estimator)
        metrics["loss"] = float(loss.detach())
        return LossOutput(loss, metrics)
