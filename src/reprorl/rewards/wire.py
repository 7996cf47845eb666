"""The verifier workers' wire format: length-prefixed pickles over a pipe, and the `LOADED` marker."""

from __future__ import annotations

import struct
from typing import BinaryIO

HEADER = struct.Struct("!Q")
MAX_MESSAGE_BYTES = 256 << 20
LOADED = b"L"  # the worker has unpickled the call: its time limit starts now


def send(stream: BinaryIO, payload: bytes) -> None:
    stream.write(HEADER.pack(len(payload)) + payload)
    stream.flush()


def receive(stream: BinaryIO) -> bytes | None:
    """One message, or None at end of stream."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"a {size}-byte message is over the {MAX_MESSAGE_BYTES}-byte bound")
    body = stream.read(size)
    return body if len(body) == size else None
