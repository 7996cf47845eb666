"""Content hashes of model artifacts: files, folders and in-memory tensors, in the store's own terms.

A file's hash is the sha256 of its bytes and a folder's is the hash of the same manifest
`ContentStore.put_tree` writes, so a model or adapter hashed here has the address it would get
if it were added to the artifact store — the version a run spec pins and a rollout records.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

from reprorl.hashing import HASH_PREFIX, canonical_json
from reprorl.store.blobs import file_hash, tree_hash

__all__ = ["file_hash", "tensors_hash", "text_hash", "tree_hash"]


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
