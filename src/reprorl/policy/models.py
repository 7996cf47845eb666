"""A loaded base model: weights, tokenizer and the hashes that say exactly which ones they are.

Every model reprorl samples from or trains comes wrapped in a `LoadedModel`, whatever its source
(the bundled GGUF, a safetensors folder, the tiny test model), so samplers and trainers use one
API. A model folder is plain transformers layout — `config.json`, `model.safetensors`, tokenizer
files — and its hash is the artifact store's hash of that folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from reprorl.errors import UserInputError
from reprorl.policy.digest import text_hash, tree_hash


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM ready to sample from, with the identity a rollout record needs."""

    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    base_hash: str  # sha256 of the GGUF file, or the store hash of the model folder
    chat_template_hash: str  # sha256 of the chat template string the tokenizer renders with
    n_params: int  # distinct parameters (tied embeddings counted once)
    path: Path | None  # where the weights can be read again (folder or GGUF); None if built in memory


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """Hide transformers' progress bars for steps that take well under a second."""
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def chat_template_of(tokenizer: PreTrainedTokenizerBase) -> str:
    template = tokenizer.chat_template
    if not isinstance(template, str) or not template:
        raise UserInputError(
            "the tokenizer has no chat template (one string); a policy renders every prompt with it"
        )
    return template


def describe(
    name: str,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    base_hash: str,
    path: Path | None,
) -> LoadedModel:
    """Wrap a model and tokenizer, computing the fields that derive from them."""
    return LoadedModel(
        name=name,
        model=model,
        tokenizer=tokenizer,
        base_hash=base_hash,
        chat_template_hash=text_hash(chat_template_of(tokenizer)),
        n_params=sum(p.numel() for p in model.parameters()),
        path=path,
    )


def clear_quantizer(model: PreTrainedModel) -> None:
    """Forget that the weights came from a GGUF file.

    transformers dequantizes GGUF tensors to plain floats on load but keeps the quantizer attached,
    and `save_pretrained` refuses a model with a non-serialisable quantizer. Nothing quantized
    remains, so dropping both markers makes it an ordinary model that saves and reloads exactly.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            module.config._is_quantized = False


def export_safetensors(model: PreTrainedModel, directory: Path) -> None:
    """Write the model's config and weights to `directory` as one `model.safetensors`."""
    clear_quantizer(model)
    # One file, not shards, so a folder hash does not depend on a shard-size setting.
    model.save_pretrained(directory, max_shard_size="1000GB")


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path) -> str:
    """Save weights and tokenizer to a new folder, staged then renamed; return the folder's hash."""
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise UserInputError(f"{str(directory)!r} is not empty; save a model into a new folder")
    staging = directory.with_name(f".tmp-{directory.name}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with quiet_progress():
            export_safetensors(model, staging)
            tokenizer.save_pretrained(staging)
        digest = tree_hash(staging)
        if directory.exists():
            directory.rmdir()
        staging.replace(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return digest


def load_folder(
    directory: Path,
    *,
    name: str | None = None,
    base_hash: str | None = None,
    dtype: torch.dtype = torch.float32,
) -> LoadedModel:
    """Load a transformers model folder from disk only; `base_hash` defaults to the folder's hash."""
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise UserInputError(f"{str(directory)!r} is not a model folder (it has no config.json)")
    digest = base_hash or tree_hash(directory)
    with quiet_progress():
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model.train(False)
    return describe(name or directory.name, model, tokenizer, base_hash=digest, path=directory)
