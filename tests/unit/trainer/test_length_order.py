"""Micro-batches are cut from rows sorted by length, and results come back in the caller's order."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from reprorl.algos import CrossEntropy
from reprorl.policy import tiny_model
from reprorl.trainer import Datum, LocalTrainer
from reprorl.trainer.local import by_length

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
