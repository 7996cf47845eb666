"""Helpers for the policy tests: a network guard and the record of SmolLM2's first load."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reprorl.policy import LoadedModel


@contextlib.contextmanager
def network_attempts() -> Iterator[list[str]]:
    """Refuse and record every attempt to open a connection or resolve a name."""
    attempts: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(repr(args[:2]))
        raise OSError("network access attempted during a policy test")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", refuse)
        patch.setattr(socket.socket, "connect_ex", refuse)
        patch.setattr(socket, "getaddrinfo", refuse)
        patch.setattr(socket, "create_connection", refuse)
        yield attempts


@dataclass(frozen=True)
class FirstLoad:
    """SmolLM2 as loaded from its GGUF into an empty cache, and what that took."""

    loaded: LoadedModel
    cache: Path
    seconds: float
    network_attempts: tuple[str, ...]
