"""LoRA adapters with peft: attach one to a model, save it as safetensors, hash it, load it back.

An adapter folder is `adapter_config.json` + `adapter_model.safetensors`; its version is the
store hash of that folder. Nothing machine-specific goes into the folder (the base model is
named by its hash, not by the path it was loaded from), so the same adapter saved anywhere has
the same hash. The adapter's random init comes from a seed and leaves the global RNG untouched.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import PreTrainedModel

from reprorl.config import LoraAdapter
from reprorl.errors import IntegrityError, UserInputError
from reprorl.policy.digest import tree_hash
from reprorl.policy.models import quiet_progress

ATTENTION_PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@contextlib.contextmanager
def _peft_deprecations_hidden() -> Iterator[None]:
    """peft asks transformers a deprecated question while wrapping; nothing a caller can act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def apply_lora(
    model: PreTrainedModel,
    *,
    rank: int = 16,
    alpha: float = 32.0,
    targets: Sequence[str] = ATTENTION_PROJECTIONS,
    dropout: float = 0.0,
    seed: int = 0,
) -> PeftModel:
    """Wrap `model` with a fresh LoRA adapter; only the adapter's parameters stay trainable.

    peft injects the adapter layers into `model` itself, so keep using the returned PeftModel.
    `lora_B` starts at zero, so the wrapped model first computes exactly what the base did.
    """
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]  # peft annotates int; scale = alpha / r is a float
        target_modules=sorted(set(targets)),  # a fixed order keeps the saved config, so the hash, stable
        lora_dropout=dropout,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]), _peft_deprecations_hidden():
        # peft draws the init on the CPU, then moves it to the model's device: seeding the CPU
        # generator alone fixes it everywhere (torch.manual_seed would also reseed every GPU).
        torch.default_generator.manual_seed(seed)
        try:
            peft_model = get_peft_model(model, config)
        except ValueError as exc:
            raise UserInputError(
                f"LoRA targets {list(targets)} do not all name modules of this model: {exc}",
                field="model.adapter.targets",
            ) from None
    if not isinstance(peft_model, PeftModel):
        raise TypeError(f"peft returned {type(peft_model).__name__}, not a PeftModel")
    return peft_model


def apply_lora_spec(model: PreTrainedModel, spec: LoraAdapter, *, seed: int) -> PeftModel:
    """`apply_lora` with the settings of a run spec's `model.adapter`."""
    return apply_lora(
        model, rank=spec.rank, alpha=spec.alpha, targets=spec.targets, dropout=spec.dropout, seed=seed
    )


def save_adapter(model: PeftModel, directory: Path, *, base_hash: str | None = None) -> str:
    """Write the adapter's config and weights (safetensors) to `directory`; return its hash.

    `base_hash` is written as the adapter's base model, in place of the local path peft would
    record, so the folder (and its hash) says which weights it belongs to and nothing else.
    """
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise UserInputError(f"{str(directory)!r} is not empty; save an adapter into a new folder")
    config = model.peft_config[model.active_adapter]
    recorded, targets = config.base_model_name_or_path, getattr(config, "target_modules", None)
    config.base_model_name_or_path = base_hash
    if isinstance(targets, set | frozenset):
        # peft keeps a set, written in the process's string-hash order: sorted, the bytes are stable.
        config.target_modules = sorted(targets)  # type: ignore[attr-defined]
    try:
        with quiet_progress():
            # Embeddings are never resized here; "auto" would look the base up by name to check.
            model.save_pretrained(str(directory), safe_serialization=True, save_embedding_layers=False)
    finally:
        config.base_model_name_or_path = recorded
        if targets is not None:
            config.target_modules = targets  # type: ignore[attr-defined]
    # peft's generated model card repeats the config; the folder keeps only what loading needs.
    (directory / "README.md").unlink(missing_ok=True)
    return adapter_hash(directory)


def adapter_base(directory: Path) -> str | None:
    """The base-model hash an adapter folder records, or None when it names no hash (a path, a hub id)."""
    try:
        config = json.loads((Path(directory) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None
    recorded = config.get("base_model_name_or_path")
    return recorded if isinstance(recorded, str) and recorded.startswith("sha256:") else None


def adapter_hash(directory: Path) -> str:
    """The adapter folder's store hash: the adapter version a sample records."""
    return tree_hash(Path(directory))


def load_adapter(
    model: PreTrainedModel,
    directory: Path,
    *,
    trainable: bool = False,
    expected_hash: str | None = None,
    base_hash: str | None = None,
) -> PeftModel:
    """Attach a saved adapter to `model` (modified in place), checking its hash when one is given.

    With `base_hash` (the hash of `model`'s weights), an adapter whose config records another base
    is refused: its low-rank updates are only meaningful on the weights they were trained against.
    """
    directory = Path(directory)
    if not (directory / "adapter_config.json").is_file():
        raise UserInputError(f"{str(directory)!r} is not an adapter folder (no adapter_config.json)")
    if base_hash is not None:
        recorded = adapter_base(directory)
        if recorded is not None and recorded != base_hash:
            raise UserInputError(
                f"adapter {directory.name} was trained on base {recorded}, not on {base_hash}; "
                "load it onto the base it was trained on"
            )
    if expected_hash is not None:
        actual = adapter_hash(directory)
        if actual != expected_hash:
            raise IntegrityError(
                f"adapter {directory} hashes to {actual[:19]}…, not the expected {expected_hash[:19]}…",
                artifact=str(directory),
                expected=expected_hash,
                actual=actual,
            )
    with _peft_deprecations_hidden():
        return PeftModel.from_pretrained(model, directory, is_trainable=trainable, local_files_only=True)
