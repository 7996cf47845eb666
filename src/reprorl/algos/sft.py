"""Supervised fine-tuning: token-level cross-entropy on demonstrated tokens (maximum likelihood).

L(θ) = −(1/N) Σ_{b,t} m_{b,t} · log π_θ(y_{b,t} | y_{b,<t}),  N = Σ m_{b,t}

Only the demonstrated assistant tokens count (m = 1); prompts and tool results are context.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reprorl.algos.base import LossOutput, TokenBatch, masked_mean
from reprorl.config.loss import Mean

if TYPE_CHECKING:
    import torch
else:
    from reprorl.algos.tensors import torch  # imported on first use


class CrossEntropy:
    """Negative log-likelihood of the demonstrated tokens, averaged over tokens."""

    name = "cross_entropy"
    mean: Mean = "token"
    inert_at_zero_advantage = False  # demonstrations carry no advantage: every one is learned

    def __call__(self, logprobs: torch.Tensor, batch: TokenBatch) -> LossOutput:
        loss = -masked_mean(logprobs, batch.mask)
        return LossOutput(loss, {"nll": float(loss.detach()), "tokens": float(batch.mask.sum())})
