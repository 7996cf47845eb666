"""Rows a loss is inert on (advantage 0, no KL term) are not run, and the update is the same."""

from __future__ import annotations

import dataclasses

import torch

from reprorl.algos import GSPO, CrossEntropy, NoCorrection, PPOClip
from reprorl.config.spec import KLPenalty, LoraAdapter
from reprorl.orchestrate.pipeline.steps import prepare
from reprorl.policy import tiny_model
from reprorl.trainer import AdamParams, Datum, LocalTrainer

PROMPT = (5, 6, 7)
DATA = [
    Datum((*PROMPT, 20, 21), (0, 0, 0, 1, 1), (-1.0,) * 5, advantage=1.0),
    Datum((*PROMPT, 30, 31, 32), (0, 0, 0, 1, 1, 1), (-1.0,) * 6, advantage=0.0),
    Datum((*PROMPT, 40), (0, 0, 0, 1), (-1.0,) * 4, advantage=-0.5),
    Datum((*PROMPT, 50, 51), (0, 0, 0, 1, 1), (-1.0,) * 5, advantage=0.0),
]


class EveryRowPPO(PPOClip):
    inert_at_zero_advantage = False  # type: ignore[assignment]  # runs the zero rows as before


class EveryRowGSPO(GSPO):
    inert_at_zero_advantage = False  # type: ignore[assignment]


def _update(loss: object, micro_batch: int = 2) -> tuple[list[torch.Tensor], dict[str, float]]:
    model = tiny_model(0)
    trainer = LocalTrainer(model.model, model.tokenizer, base_hash=model.base_hash, micro_batch=micro_batch)
    metrics = trainer.forward_backward(DATA, loss)  # type: ignore[arg-type]
    return [p.grad.clone() for p in trainer.params if p.grad is not None], metrics


def test_zero_advantage_rows_are_skipped_and_still_count_in_the_mean() -> None:
    """Token mean (PPO) and sequence mean (GSPO): the skipped rows' tokens or sequences stay in the
    denominator, so the gradient and the loss are the whole batch's, with a third fewer positions."""
    pairs = [
        (PPOClip(correction=NoCorrection()), EveryRowPPO(correction=NoCorrection())),
        (GSPO(1e-3, 1e-3, NoCorrection()), EveryRowGSPO(1e-3, 1e-3, NoCorrection())),
    ]
    for skipping, every in pairs:
        fast, fast_metrics = _update(skipping)
        slow, slow_metrics = _update(every)
        assert fast and all(torch.allclose(a, b, atol=1e-6) for a, b in zip(fast, slow, strict=True))
        assert any(bool(g.abs().sum() > 0) for g in fast)
        assert fast_metrics["skipped_rows"] == 2.0 and slow_metrics["skipped_rows"] == 0.0
        assert fast_metrics["positions"] == 5 + 4 and slow_metrics["positions"] == 5 + 6 + 4 + 5
        for key in ("loss", "pg_loss"):
            assert abs(fast_metrics[key] - slow_metrics[key]) < 1e-6


def test_nothing_is_skipped_where_the_loss_reads_more_than_the_advantage() -> None:
    """A KL penalty pulls every row toward the reference, and a demonstration has no advantage."""
    reference = [dataclasses.replace(d, reference_logprobs=(-2.0,) * len(d.input_ids)) for d in DATA]
    model = tiny_model(0)
    trainer = LocalTrainer(model.model, model.tokenizer, base_hash=model.base_hash)
    kl = trainer.forward_backward(reference, PPOClip(correction=NoCorrection(), kl_coef=0.1))
    assert kl["skipped_rows"] == 0.0 and kl["positions"] == 20
    sft = trainer.forward_backward(DATA, CrossEntropy())
    assert sft["skipped_rows"] == 0.0 and sft["positions"] == 20


def test_only_rows_that_run_get_reference_logprobs() -> None:
    adapter = LoraAdapter(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
    trainer = LocalTrainer.lora(tiny_model(0), adapter, seed=1)
    assert trainer.reference_available
    prepared = prepare(trainer, list(DATA), PPOClip(correction=NoCorrection()), None)
    assert [d.reference_logprobs is not None for d in prepared] == [True, False, True, False]
    assert [d.input_ids for d in prepared] == [d.input_ids for d in DATA]
    every = prepare(trainer, list(DATA), PPOClip(correction=NoCorrection(), kl_coef=0.1), None)
    assert all(d.reference_logprobs is not None for d in every)
    skipped = prepare(trainer, list(DATA), PPOClip(correction=NoCorrection()), None, reference=False)
    assert all(d.reference_logprobs is None for d in skipped)


def test_kl_to_the_reference_is_measured_every_step_with_a_kl_term_else_every_monitor_every() -> None:
    assert [KLPenalty(monitor_every=3).measured_at(s) for s in range(7)] == [1, 0, 0, 1, 0, 0, 1]
    assert not any(KLPenalty(monitor_every=0).measured_at(s) for s in range(7))
    assert all(KLPenalty(estimator="k3", coef=0.1, monitor_every=0).measured_at(s) for s in range(7))


def test_a_batch_the_loss_is_inert_on_runs_one_micro_batch_and_steps_the_optimizer_as_before() -> None:
    """All advantages 0: one micro-batch runs (zero gradient, health figures measured), and the
    optimizer's step after an earlier real one moves the weights exactly as running every row did."""
    flat = [dataclasses.replace(d, advantage=0.0) for d in DATA]
    weights = []
    for loss in (PPOClip(correction=NoCorrection()), EveryRowPPO(correction=NoCorrection())):
        model = tiny_model(0)
        trainer = LocalTrainer(model.model, model.tokenizer, base_hash=model.base_hash, micro_batch=2)
        trainer.forward_backward(DATA, EveryRowPPO(correction=NoCorrection()))  # the same first step
        trainer.optim_step(AdamParams(lr=1e-2))
        metrics = trainer.forward_backward(flat, loss)
        assert all(p.grad is not None and not bool(p.grad.any()) for p in trainer.params)
        assert "entropy" in metrics and metrics["loss"] == 0.0
        assert metrics["skipped_rows"] == (2.0 if loss.inert_at_zero_advantage else 0.0)
        trainer.optim_step(AdamParams(lr=1e-2))
        weights.append([p.detach().clone() for p in trainer.params])
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))
