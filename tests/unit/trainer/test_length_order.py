"""Micro-batches are cut from rows sorted by length, and results come back in the caller's order."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from reprorl.algos import CrossEntropy
from reprorl.policy import tiny_model
from reprorl.trainer import Datum, LocalTrainer
from reprorl.trainer.batching import by_length, micro_batches

LENGTHS = [9, 4, 12, 5, 7, 4, 11, 6]
DATA = [
    Datum(tuple(range(5, 5 + n)), (0, 0, 0, *([1] * (n - 3))), (0.0,) * n, advantage=1.0) for n in LENGTHS
]


def _trainer(micro_batch: int) -> LocalTrainer:
    model = tiny_model(0)
    return LocalTrainer(model.model, model.tokenizer, base_hash=model.base_hash, micro_batch=micro_batch)


def test_rows_are_batched_shortest_first_and_logprobs_return_in_the_callers_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert [LENGTHS[i] for i in by_length(DATA)] == sorted(LENGTHS)
    trainer = _trainer(3)
    widths: list[list[int]] = []
    real = trainer._logprobs

    def spy(chunk: Any, **kwargs: Any) -> Any:
        widths.append([len(d.input_ids) for d in chunk])
        return real(chunk, **kwargs)

    monkeypatch.setattr(trainer, "_logprobs", spy)
    trainer.forward_backward(DATA, CrossEntropy())
    assert widths == [[4, 4, 5], [6, 7, 9], [11, 12]]  # padding within a micro-batch: at most 2
    widths.clear()
    together = trainer.token_logprobs(DATA)
    alone = [trainer.token_logprobs([d])[0] for d in DATA]
    assert [len(t) for t in together] == [n - 1 for n in LENGTHS]
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(together, alone, strict=True))


def test_micro_batches_are_capped_by_padded_positions_as_well_as_rows() -> None:
    sql_step = [400, 500, 700, 900, 1100, 1300, 1500, 1676]
    cuts = micro_batches(sql_step, 8, 4096)
    assert cuts == [[0, 1, 2, 3], [4, 5], [6, 7]]
    padded = sum(len(c) * sql_step[c[-1]] for c in cuts)
    assert padded == 4 * 900 + 2 * 1300 + 2 * 1676 < 8 * 1676
    assert micro_batches([5000, 6000], 8, 4096) == [[0], [1]]  # too long for the budget: alone
    assert micro_batches([4, 4, 5, 6, 7], 2, 4096) == [[0, 1], [2, 3], [4]]


def test_a_position_budget_changes_the_cut_and_not_the_gradient() -> None:
    grads = []
    for budget in (4096, 20):
        model = tiny_model(0)
        trainer = LocalTrainer(
            model.model, model.tokenizer, base_hash=model.base_hash, micro_batch=8, max_positions=budget
        )
        trainer.forward_backward(DATA, CrossEntropy())
        grads.append([p.grad.clone() for p in trainer.params if p.grad is not None])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads, strict=True))
