"""PPO-EWMA's loss: the decoupled clip against π_prox, IS-weighted by π_prox/μ, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from reprorl.algos import PPOEWMA, TokenBatch
from reprorl.algos.importance import TruncatedIS


def _log(values: list[float]) -> torch.Tensor:
    return torch.log(torch.tensor([values]))


def test_ppo_ewma_clips_against_the_proximal_policy_and_weights_by_proximal_over_behaviour() -> None:
    behaviour = _log([0.5, 0.4, 0.25])
    proximal = _log([0.5, 0.6, 0.2])  # w = π_prox/μ = 1, 1.5, 0.8 (under the cap of 2)
    current = _log([0.6, 0.9, 0.1]).requires_grad_()  # r̃ = π_θ/π_prox = 1.2, 1.5, 0.5
    batch = TokenBatch(
        mask=torch.ones(1, 3),
        behaviour_logprobs=behaviour,
        advantages=torch.tensor([1.0]),
        proximal_logprobs=proximal,
    )
    out = PPOEWMA(0.2, 0.28, TruncatedIS(2.0))(current, batch)
    # A = +1: min(r̃, clip(r̃, 0.8, 1.28)) = 1.2, 1.28, 0.5; weighted 1.2, 1.92, 0.4
    assert float(out.loss.detach()) == pytest.approx(-(1.2 + 1.92 + 0.4) / 3)
    assert out.metrics["clip_frac_high"] == pytest.approx(1 / 3)
    assert out.metrics["clip_frac_low"] == 0.0
    assert out.metrics["is_weight_mean"] == pytest.approx((1.0 + 1.5 + 0.8) / 3)
    assert out.metrics["mismatch_k3"] > 0
    out.loss.backward()
    assert current.grad is not None
    # d/dlogπ of -w·r̃·A/N = -w·r̃/3 where unclipped; the clipped token gets none.
    assert current.grad.flatten().tolist() == pytest.approx([-1.2 / 3, 0.0, -0.8 * 0.5 / 3])
    assert PPOEWMA.name == "ppo_ewma"


def test_ppo_ewma_refuses_a_batch_without_proximal_logprobs() -> None:
    batch = TokenBatch(
        mask=torch.ones(1, 2),
        behaviour_logprobs=torch.full((1, 2), math.log(0.5)),
        advantages=torch.tensor([1.0]),
    )
    with pytest.raises(ValueError, match="proximal_logprobs"):
        PPOEWMA()(torch.zeros(1, 2), batch)
