"""RLOO advantages (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization…").

Each rollout's baseline is the mean reward of the other G − 1 rollouts of its group:

    Â_i = R_i − (1/(G−1)) Σ_{j≠i} R_j  =  G/(G−1) · (R_i − mean(R))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reprorl.algos.registered import register_advantage

if TYPE_CHECKING:
    import torch
else:
    from reprorl.algos.tensors import torch  # imported on first use


@register_advantage
class RLOOAdvantage:
    """Leave-one-out baseline within each group."""

    name = "rloo"

    def __call__(self, rewards: torch.Tensor) -> torch.Tensor:
        g = rewards.numel()
        if g < 2:
            return torch.zeros_like(rewards)
        return g / (g - 1) * (rewards - rewards.mean())
