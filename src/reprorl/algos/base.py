"""What every loss sees: per-token logprobs of the sampled tokens, masks and the batch's side data.

Losses are pure functions of tensors, so each one can be checked against numbers worked by hand.
Shapes: B sequences × T target positions; `mask` is 1 where a token was sampled by the policy (or
demonstrated) and 0 on prompts, tool results and padding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from reprorl.config.loss import Mean

if TYPE_CHECKING:
    import torch
else:
    from reprorl.algos.tensors import torch  # imported on first use


@dataclass(frozen=True)
class TokenBatch:
    """Targets' side data, aligned with the logprobs the trainer computes ([B, T] unless noted)."""

    mask: torch.Tensor
    behaviour_logprobs: torch.Tensor  # logprobs recorded at sampling (0 where mask is 0)
    advantages: torch.Tensor  # [B]: one advantage per sequence
    reference_logprobs: torch.Tensor | None = None  # under the base model, for a KL term
    proximal_logprobs: torch.Tensor | None = None  # π_old / π_prox of PPO; None = the behaviour policy


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


class Loss(Protocol):
    """A training objective: from the policy's token logprobs and the batch, a scalar to minimise.

    `mean` says how the scalar averages its batch, which the trainer honours when it splits a batch
    into micro-batches: "token" (every learned token weighs the same: each micro-batch's loss is
    weighted by its share of the tokens) or "sequence" (every sequence weighs the same: by its share
    of the sequences).
    """

    name: str
    mean: Mean

    @property
    def inert_at_zero_advantage(self) -> bool:
        """True when a sequence whose advantage is 0 adds exactly nothing to the loss or its gradient
        (no KL or entropy term): the trainer then skips it, though it still counts in the mean."""
        ...

    def __call__(self, logprobs: torch.Tensor, batch: TokenBatch) -> LossOutput: ...


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-level mean: every unmasked token of the batch weighs the same."""
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def sequence_means(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B]: each sequence's mean over its learned tokens (0 for a sequence with none)."""
    return (values * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)


def sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sequence-level mean of [B] values: every sequence with a learned token weighs the same."""
    present = (mask.sum(dim=-1) > 0).to(values.dtype)
    return (values * present).sum() / present.sum().clamp(min=1.0)
