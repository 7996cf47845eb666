"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): the ratio and the clip per sequence.

With s_i the length-normalised sequence ratio against the proximal policy, Â_i the sequence's
advantage, bounds ε_low, ε_high and a sequence-level importance weight w_i ≈ π_prox/μ against the
behaviour policy μ (the per-token correction of `importance.py` applied to the sequence's mean log
ratio, so it is of the same length-normalised kind):

    s_i(θ) = (π_θ(y_i | x) / π_prox(y_i | x))^(1/|y_i|)
           = exp((1/|y_i|) Σ_t log π_θ(y_{i,t}) − log π_prox(y_{i,t}))

    L(θ) = −(1/G) Σ_i w_i · min(s_i Â_i, clip(s_i, 1 − ε_low, 1 + ε_high) Â_i)
           + β · (1/G) Σ_i (1/|y_i|) Σ_t k2(π_θ, π_ref)

averaged over sequences (every sequence weighs the same, whatever its length: `mean = "sequence"`,
which the trainer honours across micro-batches). A token ratio is noisy and one clipped token says
little about its sequence; the sequence ratio is what the reward judged. The paper's bounds are
tiny (3e-4, 4e-4) because s_i is a geometric mean: a sequence-level 1.0004 is a large move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from reprorl.algos.base import LossOutput, TokenBatch, sequence_mean, sequence_means
from reprorl.algos.importance import Corrected, Correction
from reprorl.algos.kl import k3, kl_penalty
from reprorl.algos.registered import LossShared, register_loss
from reprorl.config.loss import LossConfig, Mean

if TYPE_CHECKING:
    import torch
else:
    from reprorl.algos.tensors import torch  # imported on first use


class GSPOConfig(LossConfig):
    """`kind = "gspo"`: a length-normalised sequence ratio, clipped per sequence, sequence-level mean."""

    kind: Literal["gspo"] = "gspo"
    clip_low: float = Field(default=3e-4, gt=0.0, lt=1.0, description="Sequence-ratio clip below 1 (ε_low).")
    clip_high: float = Field(default=4e-4, gt=0.0, description="Sequence-ratio clip above 1 (ε_high).")


class GSPO(Corrected):
    """The clipped surrogate on sequence ratios, IS-corrected per sequence, averaged over sequences."""

    name = "gspo"
    mean: Mean = "sequence"

    def __init__(
        self,
        clip_low: float = 3e-4,
        clip_high: float = 4e-4,
        correction: Correction | None = None,
        kl_coef: float = 0.0,
        kl_estimator: str = "k2",
    ) -> None:
        super().__init__(correction, kl_coef, kl_estimator)
        self.clip_low, self.clip_high = clip_low, clip_high

    def __call__(self, logprobs: torch.Tensor, batch: TokenBatch) -> LossOutput:
        mask = batch.mask
        proximal = batch.proximal_logprobs if batch.proximal_logprobs is not None else logprobs.detach()
        log_s = sequence_means(logprobs - proximal, mask)
        ratio = torch.exp(log_s)
        clipped = ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)
        advantages = batch.advantages
        surrogate = torch.minimum(ratio * advantages, clipped * advantages)
        # Per-sequence mean log-probs of π_prox and μ: the correction sees their geometric-mean ratio.
        weights = self.correction(
            sequence_means(proximal, mask), sequence_means(batch.behaviour_logprobs, mask)
        )
        loss = -sequence_mean(weights * surrogate, mask)
        present = mask.sum(dim=-1) > 0
        metrics = {
            "pg_loss": float(loss.detach()),
            "clip_frac_high": float(
                sequence_mean(((ratio > 1 + self.clip_high) & (advantages > 0)).float(), mask)
            ),
            "clip_frac_low": float(
                sequence_mean(((ratio < 1 - self.clip_low) & (advantages < 0)).float(), mask)
            ),
            "is_weight_mean": float(sequence_mean(weights, mask)),
            "is_weight_max": float(weights[present].max()) if present.any() else 0.0,
            "is_weight_min": float(weights[present].min()) if present.any() else 0.0,
            "mismatch_k3": float(
                sequence_mean(sequence_means(k3(proximal, batch.behaviour_logprobs), mask), mask)
            ),
            "tokens": float(mask.sum()),
        }
        loss = kl_penalty(loss, logprobs, batch, self.kl_coef, metrics, self.kl_estimator, mean="sequence")
        metrics["loss"] = float(loss.detach())
        return LossOutput(loss, metrics)


@register_loss(GSPOConfig)
def gspo(config: GSPOConfig, shared: LossShared) -> GSPO:
    return GSPO(config.clip_low, config.clip_high, shared.correction, shared.kl_coef, shared.kl_estimator)
