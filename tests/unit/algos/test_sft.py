"""Cross-entropy against numbers worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from reprorl.algos import CrossEntropy, TokenBatch


def test_cross_entropy_is_the_token_mean_of_masked_nll() -> None:
    logprobs = torch.log(torch.tensor([[0.5, 0.25, 0.1], [0.8, 0.9, 0.2]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    batch = TokenBatch(mask=mask, behaviour_logprobs=torch.zeros(2, 3), advantages=torch.zeros(2))
    out = CrossEntropy()(logprobs, batch)
    expected = -(math.log(0.5) + math.log(0.25) + math.log(0.9) + math.log(0.2)) / 4
    assert float(out.loss) == pytest.approx(expected)
    assert out.metrics["tokens"] == 4.0


def test_masked_tokens_get_no_gradient() -> None:
    logprobs = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_()
    batch = TokenBatch(
        mask=torch.tensor([[1.0, 0.0]]), behaviour_logprobs=torch.zeros(1, 2), advantages=torch.zeros(1)
    )
    CrossEntropy()(logprobs, batch).loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad.tolist() == [[-1.0, 0.0]]
