"""The wire format between the pool, the zygote and sandbox processes: length-prefixed JSON frames.

A call channel is a stream socket carrying frames (4-byte big-endian length, then UTF-8 JSON).
The sandbox end of it runs untrusted code, so the pool reads it as hostile input: every frame is
bounded in size, must parse, and must have the expected shape, or the sandbox is killed. The
control channel to the zygote is a SOCK_SEQPACKET socket, one JSON object per message.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

HEADER_BYTES = 4
# Room for the fields around a result; the result itself is bounded by the output cap.
FRAME_OVERHEAD_BYTES = 64 * 1024
# One control message: a spawn request with its limits and paths, or the zygote's tool listing.
CONTROL_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_REQUEST_BYTES = 64 * 1024 * 1024


class ProtocolError(Exception):
    """A frame that is too large, malformed, or not what the protocol allows at this point."""


def encode(message: Any) -> bytes:
    """One frame: header + compact JSON. Raises TypeError for values JSON cannot carry."""
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    return len(body).to_bytes(HEADER_BYTES, "big") + body


def decode(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError) as exc:  # RecursionError: hostile, deeply nested JSON
        raise ProtocolError(f"malformed frame: {type(exc).__name__}") from None


def reply_limit(max_output_chars: int) -> int:
    """Largest reply frame the pool accepts for a given output cap (UTF-8 is at most 4 bytes a char)."""
    return 4 * max_output_chars + FRAME_OVERHEAD_BYTES


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> Any:
    """Read one frame from an untrusted peer; IncompleteReadError when it closed the channel."""
    size = int.from_bytes(await reader.readexactly(HEADER_BYTES), "big")
    if size > max_bytes:
        raise ProtocolError(f"frame of {size} bytes exceeds the limit of {max_bytes}")
    return decode(await reader.readexactly(size))


def recv_frame(sock: socket.socket, max_bytes: int = MAX_REQUEST_BYTES) -> Any | None:
    """Blocking read of one frame (sandbox side); None when the pool closed the channel."""
    header = _recv_exactly(sock, HEADER_BYTES)
    if header is None:
        return None
    size = int.from_bytes(header, "big")
    if size > max_bytes:
        raise ProtocolError(f"frame of {size} bytes exceeds the limit of {max_bytes}")
    body = _recv_exactly(sock, size)
    if body is None:
        return None
    return decode(body)


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return bytes(buffer)


def encode_control(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def decode_control(data: bytes) -> dict[str, Any]:
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ProtocolError("a control message must be a JSON object")
    return message
