"""Importance correction for off-policy tokens: truncated and masked IS on ρ = π_prox / μ.

Tokens are sampled by a behaviour policy μ (the sampler: another precision, kernels or a stale
version) while the trainer's proximal policy is π_prox. Per token, with ρ = π_prox(y)/μ(y):

    truncated IS (Ionides 2008; Espeholt et al. 2018, IMPALA):   w = min(ρ, C)
    masked IS   (tokens whose ratio is implausible are dropped): w = ρ · 1[ρ ≤ C]

The weights carry no gradient. A product of per-token ratios over a long multi-turn trajectory
explodes (1.1 per token over 100 tokens is ≈ 13,780), so the weights are per token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from reprorl.algos.base import masked_mean
from reprorl.algos.kl import k3

if TYPE_CHECKING:
    import torch
else:
    from reprorl.algos.tensors import torch  # imported on first use


class Correction(Protocol):
    """Per-token importance weights (no gradient) from proximal and behaviour logprobs."""

    name: str

    def __call__(self, proximal: torch.Tensor, behaviour: torch.Tensor) -> torch.Tensor: ...


class NoCorrection:
    """w = 1: treat the behaviour policy as the proximal one (on-policy, same numerics)."""

    name = "none"

    def __call__(self, proximal: torch.Tensor, behaviour: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(proximal)


class TruncatedIS:
    """w = min(ρ, C)."""

    name = "tis"

    def __init__(self, cap: float = 2.0) -> None:
        self.cap = cap

    def __call__(self, proximal: torch.Tensor, behaviour: torch.Tensor) -> torch.Tensor:
        return torch.exp(proximal - behaviour).clamp(max=self.cap).detach()


class MaskedIS:
    """w = ρ where ρ ≤ C, else 0."""

    name = "mis"

    def __init__(self, cap: float = 2.0) -> None:
        self.cap = cap

    def __call__(self, proximal: torch.Tensor, behaviour: torch.Tensor) -> torch.Tensor:
        ratio = torch.exp(proximal - behaviour)
        return torch.where(ratio <= self.cap, ratio, torch.zeros_like(ratio)).detach()


class Corrected:
    """What a policy-gradient loss holds besides its own bounds: the correction and the KL penalty."""

    def __init__(self, correction: Correction | None, kl_coef: float, kl_estimator: str) -> None:
        self.correction = correction or TruncatedIS(2.0)
        self.kl_coef, self.kl_estimator = kl_coef, kl_estimator

    @property
    def inert_at_zero_advantage(self) -> bool:
        # Every term but the KL penalty is a product with the advantage.
        return self.kl_coef == 0


def token_weight_metrics(
    weights: torch.Tensor, proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """The importance weights' figures over the learned tokens, and how far μ is from π_prox (k3)."""
    learned = mask.bool()
    return {
        "is_weight_mean": float(masked_mean(weights, mask)),
        "is_weight_max": float((weights * mask).max()) if learned.any() else 0.0,
        "is_weight_min": float(weights[learned].min()) if learned.any() else 0.0,
        "mismatch_k3": float(masked_mean(k3(proximal, behaviour), mask)),
        "tokens": float(mask.sum()),
    }
