"""LoRA adapters: only adapter weights train, init follows the seed, and a saved adapter reloads exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel

from reprorl.config import LoraAdapter
from reprorl.errors import IntegrityError, UserInputError
from reprorl.policy import (
    ATTENTION_PROJECTIONS,
    LoadedModel,
    adapter_hash,
    apply_lora,
    apply_lora_spec,
    load_adapter,
    save_adapter,
    tensors_hash,
    tiny_model,
)

IDS = torch.tensor([[1, 20, 30, 40, 50, 60, 2], [1, 70, 80, 90, 100, 110, 2]])


def _lora_state(model: PeftModel) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if "lora_" in n}


def _trained(model: PeftModel, seed: int = 7) -> PeftModel:
    """Give lora_B non-zero values, as training would, so the adapter changes the outputs."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "lora_B" in name:
                param.normal_(0.0, 0.05, generator=generator)
    return model


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits  # type: ignore[no-any-return]


def test_only_adapter_parameters_are_trainable(tiny: LoadedModel) -> None:
    peft_model = apply_lora(tiny.model, rank=4, alpha=8.0)
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    layers = tiny.model.config.num_hidden_layers
    assert len(trainable) == 2 * layers * len(ATTENTION_PROJECTIONS)
    assert all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == set(ATTENTION_PROJECTIONS)
    # A backward pass reaches the adapter only.
    peft_model(input_ids=IDS, labels=IDS).loss.backward()
    for name, param in peft_model.named_parameters():
        assert (param.grad is not None) == (name in trainable), name


def test_a_fresh_adapter_computes_what_the_base_did(tiny: LoadedModel) -> None:
    base = _logits(tiny.model)
    assert torch.equal(_logits(apply_lora(tiny.model, rank=4)), base)


def test_adapter_init_follows_the_seed_and_spares_the_global_rng() -> None:
    before = torch.random.get_rng_state()
    a = tensors_hash(_lora_state(apply_lora(tiny_model(0).model, seed=1)))
    b = tensors_hash(_lora_state(apply_lora(tiny_model(0).model, seed=1)))
    c = tensors_hash(_lora_state(apply_lora(tiny_model(0).model, seed=2)))
    assert a == b != c
    assert torch.equal(torch.random.get_rng_state(), before)


def test_spec_settings_are_applied(tiny: LoadedModel) -> None:
    spec = LoraAdapter(rank=2, alpha=6.0, targets=("v_proj", "q_proj"), dropout=0.1)
    peft_model = apply_lora_spec(tiny.model, spec, seed=0)
    config = peft_model.peft_config["default"]
    assert (config.r, config.lora_alpha, config.lora_dropout) == (2, 6.0, 0.1)
    assert sorted(config.target_modules) == ["q_proj", "v_proj"]
    assert {p.shape for n, p in peft_model.named_parameters() if "lora_A" in n} <= {
        torch.Size([2, tiny.model.config.hidden_size])
    }


def test_unknown_targets_are_a_user_error(tiny: LoadedModel) -> None:
    with pytest.raises(UserInputError, match=r"model\.adapter\.targets.*nope"):
        apply_lora(tiny.model, targets=("nope",))


def test_saved_adapter_reloads_with_identical_outputs_and_a_stable_hash(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    peft_model = _trained(apply_lora(tiny.model, rank=4, alpha=8.0, seed=3))
    expected = _logits(peft_model)
    first = save_adapter(peft_model, tmp_path / "a", base_hash=tiny.base_hash)
    assert save_adapter(peft_model, tmp_path / "b", base_hash=tiny.base_hash) == first
    assert adapter_hash(tmp_path / "a") == first
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == tiny.base_hash

    reloaded = load_adapter(tiny_model(0).model, tmp_path / "a", expected_hash=first)
    assert torch.equal(_logits(reloaded), expected)
    assert not any(p.requires_grad for p in reloaded.parameters())
    assert save_adapter(reloaded, tmp_path / "c", base_hash=tiny.base_hash) == first


def test_a_trainable_reload_trains_the_adapter_only(tiny: LoadedModel, tmp_path: Path) -> None:
    digest = save_adapter(_trained(apply_lora(tiny.model, rank=4)), tmp_path / "a")
    reloaded = load_adapter(tiny_model(0).model, tmp_path / "a", trainable=True, expected_hash=digest)
    trainable = {n for n, p in reloaded.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)


def test_a_different_adapter_has_a_different_hash(tiny: LoadedModel, tmp_path: Path) -> None:
    peft_model = apply_lora(tiny.model, rank=4)
    untrained = save_adapter(peft_model, tmp_path / "a")
    trained = save_adapter(_trained(peft_model), tmp_path / "b")
    assert untrained != trained


def test_a_hash_mismatch_is_refused(tiny: LoadedModel, tmp_path: Path) -> None:
    digest = save_adapter(_trained(apply_lora(tiny.model, rank=4)), tmp_path / "a")
    with (tmp_path / "a" / "adapter_model.safetensors").open("r+b") as handle:
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 1]))
    with pytest.raises(IntegrityError) as caught:
        load_adapter(tiny_model(0).model, tmp_path / "a", expected_hash=digest)
    assert caught.value.expected == digest


def test_loading_from_a_folder_that_is_not_an_adapter(tiny: LoadedModel, tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="not an adapter folder"):
        load_adapter(tiny.model, tmp_path)


def test_save_refuses_a_folder_that_is_not_empty(tiny: LoadedModel, tmp_path: Path) -> None:
    (tmp_path / "other").write_text("x")
    with pytest.raises(UserInputError, match="not empty"):
        save_adapter(apply_lora(tiny.model, rank=2), tmp_path)


def test_an_adapter_is_refused_on_a_base_it_was_not_trained_on(tiny: LoadedModel, tmp_path: Path) -> None:
    save_adapter(apply_lora(tiny.model, rank=2), tmp_path / "a", base_hash=tiny.base_hash)
    other = tiny_model(1)
    assert other.base_hash != tiny.base_hash
    with pytest.raises(UserInputError) as caught:
        load_adapter(other.model, tmp_path / "a", base_hash=other.base_hash)
    message = str(caught.value)
    assert "\n" not in message and tiny.base_hash in message and other.base_hash in message
    # On its own base it loads.
    assert load_adapter(tiny_model(0).model, tmp_path / "a", base_hash=tiny.base_hash) is not None


def test_the_saved_config_does_not_depend_on_the_process_hash_seed(tmp_path: Path) -> None:
    import subprocess
    import sys

    child = (
        "import sys; from pathlib import Path;"
        "from reprorl.policy import apply_lora, save_adapter, tiny_model;"
        "t = tiny_model(0);"
        "m = apply_lora(t.model, rank=2, targets=('q_proj', 'k_proj', 'v_proj', 'o_proj'));"
        "print(save_adapter(m, Path(sys.argv[1]), base_hash=t.base_hash))"
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", child, str(tmp_path / seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**__import__("os").environ, "PYTHONHASHSEED": seed},
        )
        for seed in ("1", "2", "3")
    ]
    digests = set()
    for proc in children:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        digests.add(out.strip().splitlines()[-1])
    assert len(digests) == 1, digests
