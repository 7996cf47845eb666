"""Derived members: bundle files written on reading from another member whose bytes they re-encode.

A LoRA run's saved adapter folders (the warm start's, the final one) hold the same tensors as the
policy versions the run kept for them, only under peft's names. A bundle carries such bytes once:
export lists the adapter file as *derived* (its path, sha256, size, the member it comes from and
the transform), having checked that the transform gives exactly those bytes; reading runs the
transform and checks the sha256 again. A transform is registered by name with `@transform`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from safetensors import SafetensorError
from safetensors.numpy import load, save

# A source larger than this is never derived from: reading holds one source in memory at a time.
DERIVE_MAX_BYTES = 512 << 20

Transform = Callable[[bytes], bytes | None]
TRANSFORMS: dict[str, Transform] = {}


def transform(name: str) -> Callable[[Transform], Transform]:
    """Register a transform: source bytes -> derived bytes, or None where it does not apply."""

    def register(fn: Transform) -> Transform:
        TRANSFORMS[name] = fn
        return fn

    return register


# `...q_proj.lora_A.default.weight` (the trainer's parameter name) -> `...q_proj.lora_A.weight`
_ADAPTER_NAME = re.compile(r"\.(lora_A|lora_B)\.[^.]+\.weight$")


@transform("peft-adapter")
def peft_adapter(data: bytes) -> bytes | None:
    """A kept policy version's tensors as peft's `save_pretrained` writes them: each key without the
    adapter's name, `{"format": "pt"}` metadata. Numpy, not torch: a bundle is read without torch."""
    try:
        tensors = load(data)
    except (SafetensorError, KeyError, TypeError, ValueError):  # not safetensors; a dtype numpy lacks (bf16)
        return None
    renamed = {_ADAPTER_NAME.sub(r".\1.weight", key): value for key, value in tensors.items()}
    if len(renamed) != len(tensors):
        return None
    return save(renamed, metadata={"format": "pt"})
