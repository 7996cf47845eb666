"""A pinned KL reference: the weights at the pin, not the base, and kept through a checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch

from reprorl.algos import CrossEntropy
from reprorl.config.spec import LoraAdapter
from reprorl.policy import tensors_hash, tiny_model
from reprorl.trainer import AdamParams, Datum, LocalTrainer

DATA = [
    Datum((5, 6, 7, 20, 21), (0, 0, 0, 1, 1), (-1.0,) * 5),
    Datum((5, 6, 7, 30, 31, 32), (0, 0, 0, 1, 1, 1), (-1.0,) * 6),
]


def _trainer(kind: str) -> LocalTrainer:
    loaded = tiny_model(0)
    if kind == "lora":
        return LocalTrainer.lora(loaded, LoraAdapter(rank=4, alpha=8.0), seed=1)
    return LocalTrainer.full(loaded)


def _train(trainer: LocalTrainer, steps: int) -> None:
    for _ in range(steps):
        trainer.forward_backward(DATA, CrossEntropy())
        trainer.optim_step(AdamParams(lr=1e-2))


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_the_pinned_reference_is_the_policy_at_the_pin_for_lora_and_full() -> None:
    for kind in ("lora", "full"):
        trainer = _trainer(kind)
        base = trainer.reference_logprobs(DATA)
        assert trainer.reference_version is None
        _train(trainer, 3)
        version = trainer.pin_reference()
        assert version == trainer.reference_version == tensors_hash(trainer.trainable_state())
        at_pin = trainer.token_logprobs(DATA, learned_only=True)
        assert _same(trainer.reference_logprobs(DATA), at_pin), kind
        assert not _same(at_pin, base), kind  # the warm start moved the policy off the base
        _train(trainer, 3)
        before = tensors_hash(trainer.trainable_state())
        now = trainer.token_logprobs(DATA, learned_only=True)
        assert _same(trainer.reference_logprobs(DATA), at_pin), kind  # still the pinned weights
        assert not _same(now, at_pin), kind
        # Computing the reference leaves the trained weights bit for bit as they were.
        assert tensors_hash(trainer.trainable_state()) == before, kind
        assert _same(trainer.token_logprobs(DATA, learned_only=True), now), kind


def test_a_checkpoint_keeps_the_pinned_reference(tmp_path: Path) -> None:
    for kind in ("lora", "full"):
        trainer = _trainer(kind)
        _train(trainer, 2)
        trainer.pin_reference()
        at_pin = trainer.reference_logprobs(DATA)
        _train(trainer, 2)
        trainer.save_state(tmp_path / kind)
        resumed = _trainer(kind)
        resumed.load_state(tmp_path / kind)
        assert resumed.reference_version == trainer.reference_version, kind
        assert _same(resumed.reference_logprobs(DATA), at_pin), kind
        assert tensors_hash(resumed.trainable_state()) == tensors_hash(trainer.trainable_state()), kind


def test_an_unpinned_checkpoint_loads_with_the_base_as_reference(tmp_path: Path) -> None:
    trainer = _trainer("lora")
    base = trainer.reference_logprobs(DATA)
    _train(trainer, 2)
    trainer.save_state(tmp_path)
    for resumed in (_trainer("lora"), trainer):  # a fresh trainer, and one pinned since the save
        if resumed is trainer:
            trainer.pin_reference()
        resumed.load_state(tmp_path)
        assert resumed.reference_version is None
        assert _same(resumed.reference_logprobs(DATA), base)
