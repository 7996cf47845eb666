"""REINFORCE with a baseline (Williams 1992, "Simple statistical gradient-following algorithms for
connectionist reinforcement learning"), the score-function estimator without a trust region.

With Â = R − b the sequence's advantage (the baseline b is the group's: the advantage estimator's
mean-centring, so `learning.advantage` chooses it) and importance weights w ≈ π_θ/μ on tokens sampled
by the behaviour policy μ (see `importance.py`, carrying no gradient):

    L(θ) = −(1/N) Σ_{b,t} m_{b,t} · w_{b,t} · Â_b · log π_θ(a_{b,t} | s_{b,t})
           + β · (1/N) Σ m · k2(π_θ, π_ref)

averaged over tokens (N = Σ m). Its gradient is the policy gradient Σ Â ∇ log π_θ; unlike PPO
nothing bounds how far one update moves the policy, so the clip fractions are not reported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from reprorl.algos.base import LossOutput, TokenBatch, masked_mean
from reprorl.algos.importance import Corrected, Correction, token_weight_metrics
from reprorl.algos.kl import kl_penalty
from reprorl.algos.registered import LossShared, register_loss
from reprorl.config.loss import LossConfig, Mean

if TYPE_CHECKING:
    import torch
else:
    from reprorl.algos.tensors import torch  # imported on first use


class ReinforceConfig(LossConfig):
    """`kind = "reinforce"`: the score-function gradient with the group baseline; nothing to set."""

    kind: Literal["reinforce"] = "reinforce"


class Reinforce(Corrected):
    """The score-function policy gradient with the group baseline, token-level mean, IS-corrected."""

    name = "reinforce"
    mean: Mean = "token"

    def __init__(
        self, correction: Correction | None = None, kl_coef: float = 0.0, kl_estimator: str = "k2"
    ) -> None:
        super().__init__(correction, kl_coef, kl_estimator)

    def __call__(self, logprobs: torch.Tensor, batch: TokenBatch) -> LossOutput:
        mask = batch.mask
        behaviour = batch.behaviour_logprobs
        advantages = batch.advantages[:, None].expand_as(logprobs)
        weights = self.correction(logprobs.detach(), behaviour)
        loss = -masked_mean(weights * advantages * logprobs, mask)
        metrics = {
            "pg_loss": float(loss.detach()),
            **token_weight_metrics(weights, logprobs.detach(), behaviour, mask),
        }
        loss = kl_penalty(loss, logprobs, batch, self.kl_coef, metrics, self.kl_estimator)
        metrics["loss"] = float(loss.detach())
        return LossOutput(loss, metrics)


@register_loss(ReinforceConfig)
def reinforce(config: ReinforceConfig, shared: LossShared) -> Reinforce:
    return Reinforce(shared.correction, shared.kl_coef, shared.kl_estimator)
