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

import torch

from reprorl.algos.base import LossOutput, TokenBatch, masked_mean
from reprorl.algos.importance import Correction, TruncatedIS
from reprorl.algos.kl import k3, kl_penalty


class Reinforce:
    """The score-function policy gradient with the group baseline, token-level mean, IS-corrected."""

    name = "reinforce"

    def __init__(
        self, correction: Correction | None = None, kl_coef: float = 0.0, kl_estimator: str = "k2"
    ) -> None:
        self.correction = correction or TruncatedIS(2.0)
        self.kl_coef, self.kl_estimator = kl_coef, kl_estimator

    def __call__(self, logprobs: torch.Tensor, batch: TokenBatch) -> LossOutput:
        mask = batch.mask
        behaviour = batch.behaviour_logprobs
        advantages = batch.advantages[:, None].expand_as(logprobs)
        weights = self.correction(logprobs.detach(), behaviour)
        loss = -masked_mean(weights * advantages * logprobs, mask)
        metrics = {
            "pg_loss": float(loss.detach()),
            "is_weight_mean": float(masked_mean(weights, mask)),
            "is_weight_max": float((weights * mask).max()) if mask.any() else 0.0,
            "is_weight_min": float(weights[mask.bool()].min()) if mask.any() else 0.0,
            "mismatch_k3": float(masked_mean(k3(logprobs.detach(), behaviour), mask)),
            "tokens": float(mask.sum()),
        }
        loss = kl_penalty(loss, logprobs, batch, self.kl_coef, metrics, self.kl_estimator)
        metrics["loss"] = float(loss.detach())
        return LossOutput(loss, metrics)
