"""KL estimators to the reference policy (Schulman 2020, "Approximating KL Divergence").

With r = π_ref(y)/π_θ(y) for tokens y sampled from π_θ, per token:

    k1 = −log r                    (unbiased, high variance, can be negative)
    k2 = ½ (log r)²                (biased, low variance; its gradient is that of the reverse KL)
    k3 = (r − 1) − log r           (unbiased, low variance, always ≥ 0)

reprorl reports k3 and, as a penalty, uses k2's gradient (DESIGN.md).
"""

from __future__ import annotations

import torch


def k1(logprobs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    return logprobs - reference


def k2(logprobs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprobs - reference) ** 2


def k3(logprobs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    log_r = reference - logprobs
    return torch.exp(log_r) - 1.0 - log_r


ESTIMATORS = {"k1": k1, "k2": k2, "k3": k3}
