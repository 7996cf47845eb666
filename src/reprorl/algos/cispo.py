"""CISPO (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention").

PPO's clip zeroes the gradient of a token whose ratio left the trust region, and the tokens that
leave it first are the rare ones (a "However," that opens a correction). CISPO clips the importance
weight instead and stops its gradient, so every token keeps its policy-gradient term. Decoupled as
PPO is here, with r_t = π_θ/π_prox per token, Â the sequence's advantage and w_t ≈ π_prox/μ the
correction of the behaviour policy μ's tokens (see `importance.py`):

    r̂_t = clip(r_t, 1 − ε_low, 1 + ε_high)

    L(θ) = −(1/N) Σ_{b,t} m_{b,t} · w_{b,t} · sg(r̂_{b,t}) · Â_b · log π_θ(y_{b,t})
           + β · (1/N) Σ m · k2(π_θ, π_ref)

averaged over tokens (N = Σ m). The paper sets no lower bound (ε_low large) and tunes only ε_high;
`clip_low = 1.0` here is that (r̂ ≥ 0). With one update per batch and π_prox = sg(π_θ), r = 1 and
CISPO is REINFORCE with the correction; it differs once π_prox trails the weights being trained.
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


class CISPOConfig(LossConfig):
    """`kind = "cispo"`: a clipped, stopped importance weight on every token's gradient, token-level mean."""

    kind: Literal["cispo"] = "cispo"
    clip_low: float = Field(
        default=1.0, gt=0.0, le=1.0, description="Weight clip below 1 (ε_low); 1.0 = no lower bound."
    )
    clip_high: float = Field(default=0.28, gt=0.0, description="Weight clip above 1 (ε_high).")


class CISPO(Corrected):
    """REINFORCE with a clipped, stop-gradient ratio against π_prox on every token, IS-corrected."""

    name = "cispo"
    mean: Mean = "token"

    def __init__(
        self,
        clip_low: float = 1.0,
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
        ratio = torch.exp(logprobs.detach() - proximal)
        clipped = ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)
        weights = self.correction(proximal, behaviour)
        loss = -masked_mean(weights * clipped * advantages * logprobs, mask)
        metrics = {
            "pg_loss": float(loss.detach()),
            "clip_frac_high": float(masked_mean((ratio > 1 + self.clip_high).float(), mask)),
            "clip_frac_low": float(masked_mean((ratio < 1 - self.clip_low).float(), mask)),
            **token_weight_metrics(weights, proximal, behaviour, mask),
        }
        loss = kl_penalty(loss, logprobs, batch, self.kl_coef, metrics, self.kl_estimator)
        metrics["loss"] = float(loss.detach())
        return LossOutput(loss, metrics)


@register_loss(CISPOConfig)
def cispo(config: CISPOConfig, shared: LossShared) -> CISPO:
    return CISPO(config.clip_low, config.clip_high, shared.correction, shared.kl_coef, shared.kl_estimator)
