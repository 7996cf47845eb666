"""KL estimators to the reference policy (Schulman 2020, "Approximating KL Divergence").

With r = π_ref(y)/π_θ(y) for tokens y sampled from π_θ, per token:

    k1 = −log r                    (unbiased, high variance, can be negative)
    k2 = ½ (log r)²                (biased, low variance; its gradient is that of the reverse KL)
    k3 = (r − 1) − log r           (unbiased, low variance, always ≥ 0)

reprorl reports k3 whenever reference logprobs are there; as a penalty, β · mean k of the estimator
`learning.kl.estimator` names (k2 by default: its gradient is that of the reverse KL).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reprorl.algos.base import TokenBatch, masked_mean, sequence_mean, sequence_means
from reprorl.config.loss import Mean

if TYPE_CHECKING:
    import torch
else:
    from reprorl.algos.tensors import torch  # imported on first use


def k1(logprobs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    return logprobs - reference


def k2(logprobs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprobs - reference) ** 2


def k3(logprobs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    log_r = reference - logprobs
    return torch.exp(log_r) - 1.0 - log_r


ESTIMATORS = {"k1": k1, "k2": k2, "k3": k3}


def kl_penalty(
    loss: torch.Tensor,
    logprobs: torch.Tensor,
    batch: TokenBatch,
    coef: float,
    metrics: dict[str, float],
    estimator: str = "k2",
    mean: Mean = "token",
) -> torch.Tensor:
    """`loss` plus β · mean `estimator` to the reference where the batch has reference logprobs and
    β > 0; k3 is reported (`kl_k3`) whenever they are there, so KL is a health metric even when off.
    The penalty averages as the loss does (`mean`), so the trainer weighs both alike."""
    if batch.reference_logprobs is None:
        return loss
    metrics["kl_k3"] = float(masked_mean(k3(logprobs.detach(), batch.reference_logprobs), batch.mask))
    if coef > 0:
        values = ESTIMATORS[estimator](logprobs, batch.reference_logprobs)
        if mean == "token":
            loss = loss + coef * masked_mean(values, batch.mask)
        else:
            loss = loss + coef * sequence_mean(sequence_means(values, batch.mask), batch.mask)
    return loss
