"""GRPO group-relative advantages (Shao et al. 2024, "DeepSeekMath", §4.1.2).

For a group of G rollouts of one prompt with outcome rewards R_1..R_G, every token of rollout i gets

    Â_i = (R_i − mean(R)) / (std(R) + ε)

with the sample standard deviation (ddof = 1, as common implementations use). A group whose rewards
are all equal has Â = 0: it carries no signal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reprorl.algos.registered import register_advantage

if TYPE_CHECKING:
    import torch
else:
    from reprorl.algos.tensors import torch  # imported on first use


@register_advantage
class GRPOAdvantage:
    """(R − mean) / (std + ε) within each group."""

    name = "grpo"

    def __init__(self, eps: float = 1e-6) -> None:
        self.eps = eps

    def __call__(self, rewards: torch.Tensor) -> torch.Tensor:
        """`rewards`: [G] for one group; returns [G] advantages."""
        if rewards.numel() < 2:
            return torch.zeros_like(rewards)
        centred = rewards - rewards.mean()
        return centred / (rewards.std(unbiased=True) + self.eps)
