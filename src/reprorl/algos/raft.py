"""Positive-only group advantages, after RAFT (Dong et al. 2023, "RAFT: Reward rAnked FineTuning for
Generative Foundation Model Alignment") and its policy-gradient form RAFT++ (Xiong et al. 2025, "A
Minimalist Approach to LLM Reasoning: from Rejection Sampling to Reinforce"): learn only from the
members of a group that did better than it.

    Â_i = max(R_i − mean(R), 0)

The members above the group's mean are pushed up by their margin, as Dr. GRPO would push them; the
rest get no gradient. Negative advantages on a sharp policy's hot samples push down tokens it already
finds unlikely and spread their mass over the rest of the vocabulary; without them the update only
sharpens toward what worked. With shaping in the reward (`failed_calls` weighed below 0), a success
reached with no failing call outranks one reached after retries within the group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reprorl.algos.registered import register_advantage

if TYPE_CHECKING:
    import torch
else:
    from reprorl.algos.tensors import torch  # imported on first use


@register_advantage
class RAFTAdvantage:
    """max(R − mean, 0) within each group."""

    name = "raft"

    def __call__(self, rewards: torch.Tensor) -> torch.Tensor:
        return (rewards - rewards.mean()).clamp(min=0.0)
