"""Content hashes of model artifacts: files, folders and in-memory tensors, in the store's own terms.

A file's hash is the sha256 of its bytes and a folder's is the hash of the same manifest
`ContentStore.put_tree` writes, so a model or adapter hashed here has the address it would get
if it were added to the artifact store — the version a run spec pins and a rollout records.
"""

from __future__ import annotations

import hashlib
import stat
from collections.abc import Mapping
from pathlib import Path

import torch

from reprorl.errors import UserInputError
from reprorl.hashing import HASH_PREFIX, canonical_json
from reprorl.store.blobs import CHUNK, TREE_FORMAT


def file_hash(path: Path) -> str:
    """`sha256:<hex>` of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return HASH_PREFIX + digest.hexdigest()


def tree_hash(directory: Path, *, exclude: frozenset[str] = frozenset()) -> str:
    """The address `ContentStore.put_tree(directory)` would return, computed without storing.

    `exclude` names top-level files left out (a cache's own bookkeeping file).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise UserInputError(f"{str(directory)!r} is not a directory")
    entries: list[dict[str, object]] = []
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if rel in exclude or path.is_dir():
            continue
        if path.is_symlink() or not path.is_file():
            raise UserInputError(f"{rel!r} in {str(directory)!r} is not a regular file")
        entries.append(
            {
                "path": rel,
                "hash": file_hash(path),
                "size": path.stat().st_size,
                "exec": bool(path.stat().st_mode & stat.S_IXUSR),
            }
        )
    manifest = {"format": TREE_FORMAT, "entries": entries}
    return HASH_PREFIX + hashlib.sha256(canonical_json(manifest).encode("utf-8")).hexdigest()


def tensors_hash(tensors: Mapping[str, torch.Tensor]) -> str:
    """`sha256:<hex>` over names, dtypes, shapes and raw bytes, in name order.

    For in-memory checks (two models hold bit-identical weights) without writing files; the
    version recorded for a saved model or adapter is its `tree_hash`.
    """
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        header = canonical_json({"name": name, "dtype": str(tensor.dtype), "shape": list(tensor.shape)})
        digest.update(header.encode("utf-8") + b"\0")
        # Viewed as bytes so every dtype (bf16 included) hashes its exact bit pattern.
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return HASH_PREFIX + digest.hexdigest()


def text_hash(text: str) -> str:
    """`sha256:<hex>` of a string's UTF-8 bytes (a chat template, a prompt template)."""
    return HASH_PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()
