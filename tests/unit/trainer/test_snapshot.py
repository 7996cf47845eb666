"""The sampling snapshot holds exactly the merged weights of the adapter being trained, step after step."""

from __future__ import annotations

from pathlib import Path

import torch

from reprorl.algos import CrossEntropy
from reprorl.config.spec import LoraAdapter
from reprorl.policy import load_adapter, tiny_model
from reprorl.trainer import AdamParams, Datum, LocalTrainer
from reprorl.trainer.snapshot import SamplingSnapshot


def _trainer() -> LocalTrainer:
    adapter = LoraAdapter(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "gate_proj"))
    return LocalTrainer.lora(tiny_model(0), adapter, seed=3)


def _step(trainer: LocalTrainer) -> None:
    data = [Datum(tuple(range(5, 25)), (0.0,) * 5 + (1.0,) * 15, (0.0,) * 20)]
    trainer.forward_backward(data, CrossEntropy())
    trainer.optim_step(AdamParams(lr=1e-2))


def test_the_snapshot_follows_the_trained_adapter(tmp_path: Path) -> None:
    trainer = _trainer()
    _step(trainer)  # B is no longer zero: the adapter changes the outputs
    snapshot = SamplingSnapshot(trainer)
    ids = torch.tensor([list(range(5, 30))])
    assert type(snapshot.model).__name__ == "LlamaForCausalLM"

    def logits(model: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            out: torch.Tensor = model(input_ids=ids).logits
        return out

    before = logits(snapshot.model)
    torch.testing.assert_close(before, logits(trainer.model), rtol=1e-4, atol=1e-4)
    _step(trainer)
    assert torch.equal(logits(snapshot.model), before)  # stale until refreshed
    snapshot.refresh()
    after = logits(snapshot.model)
    assert not torch.equal(after, before)
    torch.testing.assert_close(after, logits(trainer.model), rtol=1e-4, atol=1e-4)

    # Bit for bit the weights peft's own merge gives for the saved adapter (as served or replayed).
    trainer.save_adapter(tmp_path / "a")
    merged = load_adapter(tiny_model(0).model, tmp_path / "a").merge_and_unload()
    ours = snapshot.model.state_dict()
    for name, tensor in merged.state_dict().items():
        assert torch.equal(ours[name], tensor), name


def test_a_bfloat16_snapshot_is_the_merge_rounded() -> None:
    trainer = _trainer()
    _step(trainer)
    snapshot = SamplingSnapshot(trainer, torch.bfloat16)
    _step(trainer)
    snapshot.refresh()
    exact = SamplingSnapshot(trainer)
    assert {p.dtype for p in snapshot.model.parameters()} == {torch.bfloat16}
    assert next(trainer.model.parameters()).dtype == torch.float32  # the trainer keeps its own
    ours, merged = snapshot.model.state_dict(), exact.model.state_dict()
    for name, tensor in merged.items():
        assert torch.equal(ours[name], tensor.to(torch.bfloat16)), name


def test_full_fine_tuning_samples_from_a_rounded_copy_that_follows() -> None:
    trainer = LocalTrainer.full(tiny_model(0))
    snapshot = SamplingSnapshot(trainer, torch.bfloat16)
    assert snapshot.model is not trainer.model
    _step(trainer)
    assert not torch.equal(snapshot.model.lm_head.weight, trainer.model.lm_head.weight.to(torch.bfloat16))
    snapshot.refresh()
    for mine, trained in zip(snapshot.model.parameters(), trainer.model.parameters(), strict=True):
        assert torch.equal(mine, trained.detach().to(torch.bfloat16))
    assert SamplingSnapshot(trainer).model is trainer.model  # same dtype: no copy
