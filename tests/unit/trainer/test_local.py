"""The local backend on the tiny model: data from trajectories, micro-batching, and learning."""

from __future__ import annotations

import pytest
import torch

from reprorl.algos import CrossEntropy
from reprorl.config.spec import LoraAdapter
from reprorl.policy import LoadedModel, tiny_model
from reprorl.trainer import AdamParams, Datum, LocalTrainer, collate, from_trajectory
from reprorl.types import Split, Termination, Trajectory, Turn


def _trajectory() -> Trajectory:
    turns = (
        Turn(index=0, prompt_token_ids=(5, 6, 7), token_ids=(8, 9), logprobs=(-0.1, -0.2), seed=1),
        Turn(index=1, prompt_token_ids=(10,), token_ids=(11, 12, 13), logprobs=(-0.3, -0.4, -0.5), seed=2),
    )
    return Trajectory(
        run_id="r",
        rollout_id="r/x",
        split=Split.TRAIN,
        task_id="t",
        task_hash="h",
        turns=turns,
        termination=Termination.ANSWERED,
    )


def test_a_trajectory_is_one_sequence_learning_only_sampled_tokens() -> None:
    datum = from_trajectory(_trajectory(), advantage=0.5)
    assert datum.input_ids == (5, 6, 7, 8, 9, 10, 11, 12, 13)
    assert datum.mask == (0, 0, 0, 1, 1, 0, 1, 1, 1)
    assert datum.behaviour_logprobs == (0, 0, 0, -0.1, -0.2, 0, -0.3, -0.4, -0.5)
    assert datum.advantage == 0.5
    # The sequence is exactly the last turn's context followed by its sample.
    t = _trajectory()
    assert datum.input_ids == t.context_ids(1) + t.turns[1].token_ids


def test_collate_shifts_targets_and_pads_right() -> None:
    a = Datum((1, 2, 3), (0, 1, 1), (0, -0.5, -0.25))
    b = Datum((4, 5), (0, 1), (0, -1.0), advantage=2.0)
    c = collate([a, b], pad_id=0)
    assert c.input_ids.tolist() == [[1, 2, 3], [4, 5, 0]]
    assert c.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert c.targets.tolist() == [[2, 3], [5, 0]]
    assert c.batch.mask.tolist() == [[1, 1], [1, 0]]
    assert c.batch.behaviour_logprobs.tolist() == [[-0.5, -0.25], [-1.0, 0.0]]
    assert c.batch.advantages.tolist() == [0.0, 2.0]
    with pytest.raises(ValueError):
        Datum((1, 2), (0,), (0, 0))


@pytest.fixture
def model() -> LoadedModel:
    return tiny_model(0)


def _data(model: LoadedModel) -> list[Datum]:
    texts = ['<tool_call>{"name": "calc"}</tool_call>', "The answer is 42.", "Ask, then answer."]
    out = []
    for text in texts:
        prompt = list(model.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"))
        reply = list(model.tokenizer.encode(text))
        out.append(
            Datum(
                tuple(prompt + reply),
                (0.0,) * len(prompt) + (1.0,) * len(reply),
                (0.0,) * (len(prompt) + len(reply)),
            )
        )
    return out


def test_micro_batches_weigh_every_token_the_same(model: LoadedModel) -> None:
    data = _data(model)
    grads = []
    for micro in (1, 3):
        fresh = tiny_model(0)
        trainer = LocalTrainer(fresh.model, fresh.tokenizer, base_hash=fresh.base_hash, micro_batch=micro)
        trainer.forward_backward(data, CrossEntropy())
        grads.append(torch.cat([p.grad.flatten() for p in trainer.params if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_sft_steps_change_the_weights_and_lower_the_loss(model: LoadedModel) -> None:
    data = _data(model)
    trainer = LocalTrainer(model.model, model.tokenizer, base_hash=model.base_hash)
    before = [p.detach().clone() for p in trainer.params]
    first = trainer.forward_backward(data, CrossEntropy())["loss"]
    trainer.optim_step(AdamParams(lr=3e-3))
    for _ in range(10):
        trainer.forward_backward(data, CrossEntropy())
        stats = trainer.optim_step(AdamParams(lr=3e-3))
    last = trainer.forward_backward(data, CrossEntropy())["loss"]
    assert last < first * 0.8
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.params, strict=True))
    assert trainer.step == 11 and stats["grad_norm"] > 0
    # Logprobs of the learned tokens rose under the trained weights.
    assert all(
        lp.numel() == len(d.input_ids) - 1 for lp, d in zip(trainer.token_logprobs(data), data, strict=True)
    )


def test_an_all_masked_batch_is_refused(model: LoadedModel) -> None:
    trainer = LocalTrainer(model.model, model.tokenizer, base_hash=model.base_hash)
    with pytest.raises(ValueError, match="no tokens to learn from"):
        trainer.forward_backward([Datum((1, 2, 3), (0, 0, 0), (0, 0, 0))], CrossEntropy())


def test_a_shared_prompt_is_run_once_with_the_same_logprobs_and_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows with a common prompt run it once (its keys and values shared, gradients flowing back
    into it from every row) and get the logprobs and gradients of running each row whole."""
    import reprorl.trainer.local as local
    from reprorl.config.spec import LoraAdapter

    base = tiny_model(0)
    system = list(base.tokenizer.encode("<|im_start|>system\n" + "Use the tools with care. " * 8))
    data = [
        Datum(
            tuple(system) + d.input_ids, (0.0,) * len(system) + d.mask, (0.0,) * (len(system) + len(d.mask))
        )
        for d in _data(base)
    ]
    adapter = LoraAdapter(rank=4, alpha=8.0, targets=("q_proj", "k_proj", "v_proj", "down_proj"))
    results = []
    for minimum in (local.MIN_SHARED_PREFIX, 1 << 30):
        monkeypatch.setattr(local, "MIN_SHARED_PREFIX", minimum)
        trainer = LocalTrainer.lora(tiny_model(0), adapter, seed=1, micro_batch=3)
        trainer.forward_backward(data, CrossEntropy())
        trainer.optim_step(AdamParams(lr=1e-2))  # B is no longer zero: the adapter shapes the prefix
        widths: list[int] = []
        inner = trainer.model.get_base_model().model
        hook = inner.register_forward_pre_hook(
            lambda _m, _a, kw, seen=widths: seen.append(kw["input_ids"].shape[1]), with_kwargs=True
        )
        trainer.forward_backward(data, CrossEntropy())
        hook.remove()
        grads = torch.cat([p.grad.flatten() for p in trainer.params if p.grad is not None])
        results.append((widths, trainer.token_logprobs(data, learned_only=True), grads))
    (shared_widths, shared_lp, shared_grads), (whole_widths, whole_lp, whole_grads) = results
    longest = max(len(d.input_ids) for d in data)
    assert whole_widths == [longest]
    assert shared_widths[0] >= len(system) and sum(shared_widths) == longest  # the prompt once
    for a, b in zip(shared_lp, whole_lp, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert shared_grads.abs().max() > 0
    torch.testing.assert_close(shared_grads, whole_grads, atol=1e-5, rtol=1e-4)


def test_an_update_reports_its_flop_bound_for_the_weights_that_learn(model: LoadedModel) -> None:
    data = _data(model)
    positions = sum(len(d.input_ids) for d in data)
    config = model.model.config
    hidden, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = config.num_key_value_heads * (hidden // config.num_attention_heads)
    per_layer = hidden * (hidden + 2 * kv) + hidden * hidden + 3 * hidden * inner
    matmuls = layers * per_layer + config.vocab_size * hidden  # the head once, tied or not

    full = LocalTrainer(model.model, model.tokenizer, base_hash=model.base_hash)
    assert full.matmul_params == matmuls
    figures = full.forward_backward(data, CrossEntropy())
    assert figures["positions"] == positions and figures["model_flops"] == 6 * matmuls * positions

    adapter = LoraAdapter(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
    fresh = tiny_model(0)
    lora = LocalTrainer.lora(fresh, adapter, seed=0)
    factors = layers * 4 * (hidden + hidden) + layers * 4 * (hidden + kv)  # A and B of q and v
    assert lora.matmul_params == matmuls + factors
    figures = lora.forward_backward(data, CrossEntropy())
    assert figures["model_flops"] == 4 * (matmuls + factors) * positions
