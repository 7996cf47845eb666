"""Advantages, importance weights, KL estimators and the PPO clip loss against hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from reprorl.algos import Reinforce, TokenBatch
from reprorl.algos.dr_grpo import DrGRPOAdvantage
from reprorl.algos.grpo import GRPOAdvantage
from reprorl.algos.importance import MaskedIS, NoCorrection, TruncatedIS
from reprorl.algos.kl import k1, k2, k3
from reprorl.algos.ppo import PPOClip
from reprorl.algos.raft import RAFTAdvantage
from reprorl.algos.rloo import RLOOAdvantage

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0])  # mean 0.5, sample std sqrt(1/3)


def test_grpo_normalises_by_the_sample_std() -> None:
    expected = 0.5 / math.sqrt(1 / 3)
    assert GRPOAdvantage(eps=0.0)(REWARDS).tolist() == pytest.approx(
        [expected, -expected, -expected, expected]
    )
    assert GRPOAdvantage()(torch.tensor([1.0, 1.0, 1.0])).tolist() == [0.0, 0.0, 0.0]


def test_dr_grpo_only_centres() -> None:
    assert DrGRPOAdvantage()(REWARDS).tolist() == [0.5, -0.5, -0.5, 0.5]


def test_rloo_uses_the_others_mean() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.5])
    # member 0: 1 - mean(0, 0.5) = 0.75; member 1: 0 - 0.75 = -0.75; member 2: 0.5 - 0.5 = 0
    assert RLOOAdvantage()(rewards).tolist() == pytest.approx([0.75, -0.75, 0.0])


def test_raft_keeps_only_the_members_above_the_mean() -> None:
    # mean 0.4: a first-time success (1.0) outranks a success after a failing call (0.9 with
    # failed_calls weighed -0.1); members at or below the mean get no gradient.
    rewards = torch.tensor([1.0, 0.9, 0.0, -0.3, 0.4])
    assert RAFTAdvantage()(rewards).tolist() == pytest.approx([0.6, 0.5, 0.0, 0.0, 0.0])
    assert RAFTAdvantage()(torch.tensor([1.0, 1.0])).tolist() == [0.0, 0.0]


def test_kl_estimators_by_hand() -> None:
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    # r = π_ref/π_θ = 0.5, log r = -log 2
    assert float(k1(logp, ref)) == pytest.approx(math.log(2))
    assert float(k2(logp, ref)) == pytest.approx(0.5 * math.log(2) ** 2)
    assert float(k3(logp, ref)) == pytest.approx(0.5 - 1 + math.log(2))
    assert float(k3(ref, ref)) == 0.0


def test_importance_weights() -> None:
    proximal = torch.log(torch.tensor([0.5, 0.9, 0.3]))
    behaviour = torch.log(torch.tensor([0.5, 0.3, 0.6]))
    # ratios 1, 3, 0.5
    assert TruncatedIS(2.0)(proximal, behaviour).tolist() == pytest.approx([1.0, 2.0, 0.5])
    assert MaskedIS(2.0)(proximal, behaviour).tolist() == pytest.approx([1.0, 0.0, 0.5])
    assert NoCorrection()(proximal, behaviour).tolist() == [1.0, 1.0, 1.0]


def _batch(advantages: list[float], proximal: torch.Tensor, mask: torch.Tensor) -> TokenBatch:
    return TokenBatch(
        mask=mask,
        behaviour_logprobs=proximal,
        advantages=torch.tensor(advantages),
        proximal_logprobs=proximal,
    )


def test_ppo_clip_with_asymmetric_bounds_by_hand() -> None:
    proximal = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    # ratios: row 0 (A=+1): 1.5 (clipped at 1.28), 1.1; row 1 (A=-1): 0.6 (clipped at 0.8), 1.0 (masked)
    current = torch.log(torch.tensor([[0.75, 0.55], [0.3, 0.5]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    out = PPOClip(0.2, 0.28, NoCorrection())(current, _batch([1.0, -1.0], proximal, mask))
    # min(r A, clip(r) A): 1.28, 1.1, and for A=-1 min(-0.6, -0.8) = -0.8
    expected = -(1.28 + 1.1 - 0.8) / 3
    assert float(out.loss.detach()) == pytest.approx(expected)
    assert out.metrics["clip_frac_high"] == pytest.approx(1 / 3)
    assert out.metrics["clip_frac_low"] == pytest.approx(1 / 3)
    out.loss.backward()
    assert current.grad is not None
    # Clipped tokens get no gradient; the unclipped one gets -A·r/N; the masked one nothing.
    assert current.grad.flatten().tolist() == pytest.approx([0.0, -1.1 / 3, 0.0, 0.0])


def test_ppo_weights_tokens_by_truncated_is_and_adds_kl() -> None:
    behaviour = torch.log(torch.tensor([[0.2, 0.5]]))
    proximal = torch.log(torch.tensor([[0.6, 0.5]]))  # ratio 3, capped at 2; and 1
    current = proximal.clone().requires_grad_()  # current = proximal: ratio 1
    batch = TokenBatch(
        mask=torch.ones(1, 2),
        behaviour_logprobs=behaviour,
        advantages=torch.tensor([1.0]),
        proximal_logprobs=proximal,
        reference_logprobs=torch.log(torch.tensor([[0.3, 0.5]])),
    )
    out = PPOClip(correction=TruncatedIS(2.0), kl_coef=0.1)(current, batch)
    kl2 = 0.5 * math.log(2) ** 2 / 2  # k2 on token 0 only, averaged over 2 tokens
    assert float(out.loss.detach()) == pytest.approx(-(2.0 + 1.0) / 2 + 0.1 * kl2)
    assert out.metrics["is_weight_max"] == pytest.approx(2.0)
    assert out.metrics["kl_k3"] == pytest.approx((0.5 - 1 + math.log(2)) / 2)
    assert out.metrics["mismatch_k3"] > 0


@pytest.mark.parametrize(
    ("estimator", "per_token0"),
    [("k1", math.log(2)), ("k2", 0.5 * math.log(2) ** 2), ("k3", 0.5 - 1 + math.log(2))],
)
def test_the_kl_penalty_is_the_estimator_the_spec_names(estimator: str, per_token0: float) -> None:
    logprobs = torch.log(torch.tensor([[0.6, 0.5]]))  # token 0: log(π/ref) = log 2; token 1: 0
    batch = TokenBatch(
        mask=torch.ones(1, 2),
        behaviour_logprobs=logprobs,
        advantages=torch.tensor([0.0]),  # no policy-gradient term: the loss is the penalty alone
        proximal_logprobs=logprobs,
        reference_logprobs=torch.log(torch.tensor([[0.3, 0.5]])),
    )
    for loss in (
        PPOClip(correction=TruncatedIS(2.0), kl_coef=0.5, kl_estimator=estimator),
        Reinforce(TruncatedIS(2.0), kl_coef=0.5, kl_estimator=estimator),
    ):
        assert float(loss(logprobs, batch).loss) == pytest.approx(0.5 * per_token0 / 2)
