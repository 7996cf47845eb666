"""Launching a served policy: base model (and adapter) into a `LocalSampler`, then uvicorn until a signal.

The served weights are named by a policy version: `base:<base hash>` for a base alone, or
`adapter:<adapter hash>` when an adapter is merged into it (the adapter folder records the hash
of the base it was trained on, and a mismatch is refused).
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import cast

import torch
import uvicorn
from fastapi import FastAPI
from transformers import PreTrainedModel

from reprorl.errors import UserInputError
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


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (0 picks a free port); a failure is one UserInputError line."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[
            0
        ]
    except OSError as exc:
        raise UserInputError(f"{host!r} does not resolve to an address: {exc}", field="host") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise UserInputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    """`http://HOST:PORT/v1` for a bound socket (IPv6 hosts in brackets)."""
    address, port = sock.getsockname()[:2]
    host = f"[{address}]" if ":" in str(address) else str(address)
    return f"http://{host}:{port}/v1"


class _AnnouncingServer(uvicorn.Server):
    """uvicorn, calling back once it accepts connections (after the app's startup has run)."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_started()


def run_server(
    app: FastAPI, sock: socket.socket, *, on_started: Callable[[], None], graceful_shutdown_s: int = 30
) -> None:
    """Serve `app` on `sock` until SIGINT or SIGTERM, then shut down gracefully and return."""
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=graceful_shutdown_s,
    )
    server = _AnnouncingServer(config, on_started)

    def already_handled(signum: int, frame: FrameType | None) -> None:
        return None

    # uvicorn shuts down on these signals, then raises them again against the handlers it found
    # installed: with these, a signalled server returns normally instead of dying by the signal.
    previous = {sig: signal.signal(sig, already_handled) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
