"""REINFORCE with a baseline: its gradient is -w·Â·∇log π per token, averaged over tokens."""

from __future__ import annotations

import pytest
import torch

from reprorl.algos import NoCorrection, PPOClip, TokenBatch, TruncatedIS
from reprorl.algos.reinforce import Reinforce
from reprorl.config.spec import LearningSpec
from reprorl.orchestrate.pipeline.steps import make_loss


def _batch() -> tuple[torch.Tensor, TokenBatch]:
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]], requires_grad=True)
    batch = TokenBatch(
        mask=torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]),
        behaviour_logprobs=torch.tensor([[-1.0, -2.5, -0.5], [-0.3, -0.7, 0.0]]),
        advantages=torch.tensor([0.5, -1.0]),
    )
    return logprobs, batch


def test_the_gradient_is_the_weighted_score_function_per_token() -> None:
    logprobs, batch = _batch()
    out = Reinforce(NoCorrection())(logprobs, batch)
    out.loss.backward()
    assert logprobs.grad is not None
    expected = -(batch.advantages[:, None] * batch.mask) / batch.mask.sum()
    assert torch.allclose(logprobs.grad, expected)
    # The value itself: minus the mean over the 5 tokens of Â·log π.
    assert out.metrics["pg_loss"] == pytest.approx(-(0.5 * (-3.5) + -1.0 * (-1.0)) / 5)


def test_importance_weights_scale_each_token_and_carry_no_gradient() -> None:
    logprobs, batch = _batch()
    Reinforce(TruncatedIS(2.0))(logprobs, batch).loss.backward()
    assert logprobs.grad is not None
    # Token (0, 1): π/μ = e^{0.5} ≈ 1.65 (under the cap); the others are on-policy (w = 1).
    weight = torch.ones_like(logprobs)
    weight[0, 1] = torch.exp(torch.tensor(0.5))
    expected = -(weight * batch.advantages[:, None] * batch.mask) / batch.mask.sum()
    assert torch.allclose(logprobs.grad, expected)


def test_unlike_ppo_a_large_step_is_not_clipped() -> None:
    """Far from the proximal policy PPO's gradient vanishes on a clipped token; REINFORCE's does not."""
    logprobs, batch = _batch()
    moved = (logprobs.detach() + 1.0).requires_grad_(True)
    proximal = TokenBatch(batch.mask, batch.behaviour_logprobs, batch.advantages, None, logprobs.detach())
    PPOClip(correction=NoCorrection())(moved, proximal).loss.backward()
    assert moved.grad is not None and float(moved.grad[0].abs().sum()) == 0.0  # r = e > 1.28, Â > 0
    again = (logprobs.detach() + 1.0).requires_grad_(True)
    Reinforce(NoCorrection())(again, proximal).loss.backward()
    assert again.grad is not None and float(again.grad[0].abs().sum()) > 0.0


def test_the_spec_names_the_loss_that_trains() -> None:
    for name, kind in (("reinforce", Reinforce), ("ppo_clip", PPOClip)):
        loss = make_loss(
            LearningSpec(owner="o", loss=name, correction="none", kl={"estimator": "k3", "coef": 0.1})
        )
        assert type(loss) is kind and loss.name == name and loss.kl_coef == 0.1
        assert isinstance(loss.correction, NoCorrection)
