"""Launching a served policy: base model (and adapter) into a `LocalSampler`, then uvicorn until a signal.

The served weights are named by a policy version: `base:<base hash>` for a base alone, or
`adapter:<adapter hash>` when an adapter is merged into it (the adapter folder records the hash
of the base it was trained on, and a mismatch is refused).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from transformers import PreTrainedModel

from reprorl.errors import UserInputError
from reprorl.http_server import base_url
from reprorl.policy import LoadedModel, adapter_hash, load_adapter, load_base, tiny_model
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import LocalSampler
from reprorl.store import Store

TINY_PREFIX = "tiny:"


@dataclass(frozen=True)
class ServedPolicy:
    """What a policy server serves: the model's name, its sampler and renderer, and its version."""

    name: str
    sampler: LocalSampler
    renderer: ChatRenderer

    @property
    def policy_version(self) -> str:
        return self.sampler.policy_version


def load_policy(
    base: str, *, adapter: Path | None = None, store: Store | None = None, dtype: torch.dtype = torch.float32
) -> ServedPolicy:
    """Load `base` (a `load_base` source, or `tiny:SEED`) with `adapter` merged in, if given."""
    loaded = _load_base(base, store, dtype)
    model, version = loaded.model, f"base:{loaded.base_hash}"
    if adapter is not None:
        model, version = _merge_adapter(loaded, Path(adapter))
    sampler = LocalSampler(model, loaded.tokenizer, model_hash=loaded.base_hash, policy_version=version)
    return ServedPolicy(name=loaded.name, sampler=sampler, renderer=ChatRenderer(loaded.tokenizer))


def _load_base(base: str, store: Store | None, dtype: torch.dtype) -> LoadedModel:
    if not base.startswith(TINY_PREFIX):
        return load_base(base, store=store, dtype=dtype)
    try:
        seed = int(base.removeprefix(TINY_PREFIX))
    except ValueError:
        raise UserInputError(
            f"{base!r}: the tiny model takes an integer seed, e.g. tiny:0", field="base"
        ) from None
    loaded = tiny_model(seed)
    # transformers' wrapper of `to` hides torch's signature from type checkers.
    cast(torch.nn.Module, loaded.model).to(dtype)
    return loaded


def _merge_adapter(loaded: LoadedModel, directory: Path) -> tuple[PreTrainedModel, str]:
    # An adapter applied to weights other than those it was trained on serves nonsense: refused.
    peft_model = load_adapter(loaded.model, directory, base_hash=loaded.base_hash)
    version = f"adapter:{adapter_hash(directory)}"
    # Merged once here, a token costs what it costs on the base: no adapter matmuls while decoding.
    merged = peft_model.merge_and_unload()
    if not isinstance(merged, PreTrainedModel):
        raise TypeError(f"merging the adapter gave a {type(merged).__name__}, not a PreTrainedModel")
    return merged, version


def url_of(sock: socket.socket) -> str:
    """`http://HOST:PORT/v1` for a bound socket (IPv6 hosts in brackets)."""
    return f"{base_url(sock)}/v1"
