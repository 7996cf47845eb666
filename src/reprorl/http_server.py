"""Serving an ASGI app on a socket bound first: a port in use fails at once, a signal ends it cleanly."""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from reprorl.errors import UserInputError


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


def base_url(sock: socket.socket) -> str:
    """`http://HOST:PORT` for a bound socket (IPv6 hosts in brackets)."""
    address, port = sock.getsockname()[:2]
    host = f"[{address}]" if ":" in str(address) else str(address)
    return f"http://{host}:{port}"


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
    app: Any, sock: socket.socket, *, on_started: Callable[[], None], graceful_shutdown_s: int = 30
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
