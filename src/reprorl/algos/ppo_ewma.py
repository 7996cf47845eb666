"""PPO-EWMA (Hilton, Cobbe & Schulman 2021, "Batch size-invariance for policy optimization").

Decoupled PPO whose proximal policy is the policy at an exponential moving average of past weights,
θ_prox ← β · θ_prox + (1 − β) · θ after every optimizer step (β = `learning.loss.ewma_decay`; see
`reprorl.trainer.ewma`). With r̃ = π_θ/π_prox per token, Â the sequence's advantage, bounds ε_low,
ε_high and importance weights w ≈ π_prox/μ against the behaviour policy μ (see `importance.py`):

    L(θ) = −(1/N) Σ_{b,t} m_{b,t} · w_{b,t} · min(r̃ Â, clip(r̃, 1 − ε_low, 1 + ε_high) Â)
           + β_KL · (1/N) Σ m · k2(π_θ, π_ref)

The clip bounds each update against π_prox and w corrects for μ separately, so how stale the sampler
is no longer sets the step size; θ_prox trails θ by β/(1 − β) steps on average, and the paper keeps
training invariant to the batch size by rescaling that lag (with the learning rate) when it changes.
This is `PPOClip` with π_prox required: PPOClip's fallback (no π_prox given) is not the EWMA policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from reprorl.algos.base import LossOutput, TokenBatch
from reprorl.algos.importance import Correction
from reprorl.algos.ppo import ClipBounds, PPOClip
from reprorl.algos.registered import LossShared, register_loss

if TYPE_CHECKING:
    import torch
else:
    from reprorl.algos.tensors import torch  # imported on first use


class PPOEWMAConfig(ClipBounds):
    """`kind = "ppo_ewma"`: PPO clip against an exponential moving average of past weights."""

    kind: Literal["ppo_ewma"] = "ppo_ewma"
    ewma_decay: float = Field(
        default=0.9, ge=0.0, lt=1.0, description="Decay β of the proximal policy's moving average."
    )


class PPOEWMA(PPOClip):
    """The decoupled clipped surrogate against the EWMA policy; `proximal_logprobs` must be given."""

    name = "ppo_ewma"

    def __init__(
        self,
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        correction: Correction | None = None,
        kl_coef: float = 0.0,
        kl_estimator: str = "k2",
        ewma_decay: float = 0.9,
    ) -> None:
        super().__init__(clip_low, clip_high, correction, kl_coef, kl_estimator)
        self.ewma_decay = ewma_decay  # the trainer's EWMA of the weights gives π_prox

    def __call__(self, logprobs: torch.Tensor, batch: TokenBatch) -> LossOutput:
        if batch.proximal_logprobs is None:
            raise ValueError(
                "ppo_ewma needs the EWMA policy's logprobs in TokenBatch.proximal_logprobs "
                "(reprorl.trainer.ewma.EWMAWeights.proximal_logprobs); without them it is not PPO-EWMA"
            )
        return super().__call__(logprobs, batch)


@register_loss(PPOEWMAConfig)
def ppo_ewma(config: PPOEWMAConfig, shared: LossShared) -> PPOEWMA:
    return PPOEWMA(
        config.clip_low,
        config.clip_high,
        shared.correction,
        shared.kl_coef,
        shared.kl_estimator,
        ewma_decay=config.ewma_decay,
    )
