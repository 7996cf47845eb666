"""Running the dashboard: in the foreground for `reprorl serve dashboard`, or on a thread for a caller.

Either way the socket is bound before anything else, on 127.0.0.1 unless told otherwise, and a bind
off loopback gets a token (printed once, in the URL to open) without which every request is refused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import uvicorn

from reprorl.dashboard.app import create_app
from reprorl.dashboard.security import TOKEN_PARAM, Access
from reprorl.http_server import base_url, bind, run_server
from reprorl.store import Store


def open_url(url: str, access: Access) -> str:
    """The URL a person opens: with the token when one is needed (it then lives in a cookie)."""
    return f"{url}/?{TOKEN_PARAM}={access.token}" if access.token else f"{url}/"


def serve_dashboard(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    on_started: Callable[[str], None] | None = None,
) -> None:
    """Serve the dashboard until SIGINT or SIGTERM; `on_started` gets the URL to open."""
    Access.for_bind(host, port, token)  # a bad token is refused before a port is taken
    sock = bind(host, port)
    try:
        access = Access.for_bind(host, sock.getsockname()[1], token)
        url = open_url(base_url(sock), access)
        run_server(
            create_app(store, access), sock, on_started=lambda: on_started(url) if on_started else None
        )
    finally:
        sock.close()


class DashboardServer:
    """The dashboard on a thread of this process: `url` once started, `close()` to stop it."""

    def __init__(
        self,
        store: Store,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        poll_s: float = 1.0,
        decode_tokens: bool = True,
    ) -> None:
        Access.for_bind(host, port, token)  # a bad token is refused before a port is taken
        self._sock = bind(host, port)
        self.access = Access.for_bind(host, self._sock.getsockname()[1], token)
        self.url = base_url(self._sock)
        app = create_app(store, self.access, poll_s=poll_s, decode_tokens=decode_tokens)
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True, name="dashboard"
        )
        self._thread.start()
        deadline = time.monotonic() + 30.0
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the dashboard did not start")
            time.sleep(0.02)

    @property
    def open_url(self) -> str:
        return open_url(self.url, self.access)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(10.0)
        self._sock.close()

    def __enter__(self) -> DashboardServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
