"""GSPO and CISPO against hand-worked numbers, and the spec's loss table selecting them by kind."""

from __future__ import annotations

import math

import pytest
import torch

from reprorl.algos import CISPO, GSPO, NoCorrection, PPOClip, TokenBatch, TruncatedIS
from reprorl.config import LearningSpec
from reprorl.config.load import stored_spec
from reprorl.orchestrate.pipeline.steps import make_loss


def _batch(
    advantages: list[float], proximal: torch.Tensor, mask: torch.Tensor, **kw: torch.Tensor
) -> TokenBatch:
    return TokenBatch(
        mask=mask,
        behaviour_logprobs=kw.get("behaviour", proximal),
        advantages=torch.tensor(advantages),
        proximal_logprobs=proximal,
    )


def test_gspo_clips_the_length_normalised_sequence_ratio() -> None:
    proximal = torch.log(torch.full((2, 3), 0.5))
    # Row 0 (A=+1): token ratios 1.2, 1.2, masked -> s = 1.2, clipped at 1.1. Row 1 (A=-1): ratios
    # 0.8, 1.25, 1.0 -> s = (0.8 * 1.25 * 1)^(1/3) = 1, inside the bounds.
    current = torch.log(torch.tensor([[0.6, 0.6, 0.5], [0.4, 0.625, 0.5]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    out = GSPO(0.1, 0.1, NoCorrection())(current, _batch([1.0, -1.0], proximal, mask))
    # Sequence mean: -(min(1.2, 1.1) * 1 + 1 * -1) / 2 = -(1.1 - 1) / 2
    assert float(out.loss.detach()) == pytest.approx(-0.05)
    assert out.metrics["clip_frac_high"] == pytest.approx(0.5)
    out.loss.backward()
    assert current.grad is not None
    # The clipped sequence passes no gradient; the other's tokens share s·A/|y| = -1/3 each, over G = 2.
    assert current.grad[0].abs().sum() == 0.0
    assert current.grad[1].tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6])


def test_gspo_weighs_sequences_not_tokens() -> None:
    """A long sequence and a short one move the loss alike: the mean is over sequences."""
    proximal = torch.log(torch.full((2, 4), 0.5))
    current = proximal.clone().requires_grad_()
    mask = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    GSPO(correction=NoCorrection())(current, _batch([1.0, 1.0], proximal, mask)).loss.backward()
    assert current.grad is not None
    per_sequence = current.grad.sum(dim=-1).tolist()
    assert per_sequence == pytest.approx([-0.5, -0.5])
    assert GSPO.mean == "sequence" and PPOClip.mean == "token"


def test_gspo_corrects_the_sampler_per_sequence() -> None:
    proximal = torch.log(torch.full((1, 2), 0.5))
    behaviour = torch.log(torch.tensor([[0.25, 0.25]]))  # geometric-mean ratio 2 -> capped at 1.5
    out = GSPO(correction=TruncatedIS(1.5))(
        proximal.clone(), _batch([1.0], proximal, torch.ones(1, 2), behaviour=behaviour)
    )
    assert out.metrics["is_weight_mean"] == pytest.approx(1.5)
    assert float(out.loss.detach()) == pytest.approx(-1.5)


def test_cispo_keeps_every_tokens_gradient_with_a_clipped_stopped_weight() -> None:
    proximal = torch.log(torch.full((1, 3), 0.5))
    # Ratios 1.5 (clipped to 1.28), 1.0, 0.2 (no lower bound: kept at 0.2). A = +1.
    current = torch.log(torch.tensor([[0.75, 0.5, 0.1]])).requires_grad_()
    out = CISPO(1.0, 0.28, NoCorrection())(current, _batch([1.0], proximal, torch.ones(1, 3)))
    out.loss.backward()
    assert current.grad is not None
    # d/dlogπ of -(1/3) Σ sg(r̂) A logπ = -r̂/3 per token: no token's gradient is cut.
    assert current.grad[0].tolist() == pytest.approx([-1.28 / 3, -1.0 / 3, -0.2 / 3])
    expected = -(1.28 * math.log(0.75) + math.log(0.5) + 0.2 * math.log(0.1)) / 3
    assert float(out.loss.detach()) == pytest.approx(expected)
    assert out.metrics["clip_frac_high"] == pytest.approx(1 / 3)
    # PPO clip on the same batch passes nothing through the token above its bound.
    ppo_current = current.detach().clone().requires_grad_()
    PPOClip(0.2, 0.28, NoCorrection())(ppo_current, _batch([1.0], proximal, torch.ones(1, 3))).loss.backward()
    assert ppo_current.grad is not None and float(ppo_current.grad[0, 0]) == 0.0


def test_the_loss_table_selects_by_kind_with_its_own_fields() -> None:
    for table, kind in (
        ({"kind": "gspo", "clip_high": 1e-3}, GSPO),
        ("cispo", CISPO),
        ({"clip_low": 0.1}, PPOClip),
    ):
        learning = LearningSpec.model_validate({"owner": "o", "loss": table, "correction": "none"})
        loss = make_loss(learning)
        assert type(loss) is kind and isinstance(loss.correction, NoCorrection)  # type: ignore[attr-defined]
    assert (
        make_loss(
            LearningSpec.model_validate({"owner": "o", "loss": {"kind": "gspo", "clip_high": 1e-3}})
        ).clip_high
        == 1e-3
    )  # type: ignore[attr-defined]
    assert make_loss(LearningSpec.model_validate({"owner": "o", "loss": {"clip_low": 0.1}})).clip_low == 0.1  # type: ignore[attr-defined]


def test_records_with_the_loss_flat_in_learning_still_load() -> None:
    def doc(learning: dict[str, object]) -> dict[str, object]:
        return {
            "name": "old",
            "seed": 0,
            "model": {"owner": "o", "base": "sha256:" + "a" * 64},
            "data": {"owner": "o", "train": "sha256:" + "b" * 64},
            "learning": {"owner": "o", **learning},
            "evaluation": {"owner": "o", "suites": ["sha256:" + "c" * 64]},
        }

    old = stored_spec(doc({"loss": "ppo_ewma", "clip_low": 0.1, "clip_high": 0.2, "ewma_decay": 0.8}))
    assert old.learning.loss.model_dump() == {
        "kind": "ppo_ewma",
        "clip_low": 0.1,
        "clip_high": 0.2,
        "ewma_decay": 0.8,
    }
    # REINFORCE never read the clip bounds: they had no effect and are dropped.
    old = stored_spec(doc({"loss": "reinforce", "clip_low": 0.2, "clip_high": 0.28, "ewma_decay": 0.9}))
    assert old.learning.loss.model_dump() == {"kind": "reinforce"}
