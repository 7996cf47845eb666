"""Dr. GRPO advantages (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective").

Dropping GRPO's per-group std normalisation removes its question-level difficulty bias:

    Â_i = R_i − mean(R)

(its other fix, a constant length normaliser instead of 1/|o_i|, is the token-level loss mean with
a fixed token budget, chosen in the loss, not here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reprorl.algos.registered import register_advantage

if TYPE_CHECKING:
    import torch
else:
    from reprorl.algos.tensors import torch  # imported on first use


@register_advantage
class DrGRPOAdvantage:
    """R − mean within each group; no std scaling."""

    name = "dr_grpo"

    def __call__(self, rewards: torch.Tensor) -> torch.Tensor:
        return rewards - rewards.mean()
