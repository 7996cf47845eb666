"""The zygote's control socket under load: many senders waiting on a full socket all get through."""

from __future__ import annotations

import asyncio
import select
import socket
import subprocess
import sys
import threading
import time

import pytest

from reprorl.envs.sandbox.errors import SandboxError
from reprorl.envs.sandbox.protocol import decode_control, encode_control
from reprorl.envs.sandbox.zygote import LEAN_START, ZygoteClient, _package_parent


def test_every_sender_waiting_on_a_full_control_socket_gets_through() -> None:
    """A thousand sandboxes opening at once fill the socket: each sender waits for room. asyncio
    keeps one writer callback per fd, so waiters that each register one lose wake-ups and hang."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    ours.setblocking(False)
    received: list[int] = []

    def drain() -> None:
        time.sleep(0.5)  # the socket fills and the senders queue up first
        theirs.settimeout(10)
        while len(received) < 200:
            received.append(decode_control(theirs.recv(1 << 16))["id"])

    reader = threading.Thread(target=drain)
    reader.start()

    async def go() -> None:
        client = ZygoteClient(["x"], [])
        client._control, client._loop, client._alive = ours, asyncio.get_running_loop(), True
        sends = [client._send({"op": "spawn", "id": i, "pad": "x" * 512}, ()) for i in range(200)]
        await asyncio.wait_for(asyncio.gather(*sends), timeout=20)

    asyncio.run(go())
    reader.join(timeout=20)
    ours.close()
    theirs.close()
    assert sorted(received) == list(range(200))


class _Refusing:
    """A control socket whose messages cannot be taken: every recv is refused memory."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def recv(self, size: int) -> bytes:
        raise MemoryError

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()


def test_a_message_that_cannot_be_taken_gives_up_the_channel_not_spins() -> None:
    """A refused allocation in the reader leaves the socket readable: the reader is removed, waiting
    callers get a `SandboxError`, and the error goes on to the loop once."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    seen: list[BaseException] = []

    async def go() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: seen.append(context["exception"]))
        client = ZygoteClient(["x"], [])
        client._control, client._loop, client._alive = _Refusing(ours), loop, True  # type: ignore[assignment]
        loop.add_reader(ours.fileno(), client._on_readable)
        waiting = loop.create_future()
        client._pending[1] = waiting
        theirs.send(b"{}")
        with pytest.raises(SandboxError, match="MemoryError"):
            await asyncio.wait_for(waiting, 5)
        await asyncio.sleep(0.05)

    asyncio.run(go())
    theirs.close()
    assert len(seen) == 1 and isinstance(seen[0], MemoryError)


def test_the_zygote_shuts_down_cleanly_when_the_pool_resets_the_connection() -> None:
    """A pool killed with the zygote's replies unread resets the control socket instead of closing
    it: the zygote must take that as the pool gone (stop its sandboxes, exit 0), not die on it."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    process = subprocess.Popen(
        [sys.executable, "-c", LEAN_START, "--fd", str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": _package_parent()},
    )
    theirs.close()
    ours.sendall(encode_control({"op": "init", "modules": [], "sys_path": []}))
    ours.settimeout(60)
    ready = decode_control(ours.recv(1 << 16))
    assert ready["op"] == "ready"
    ours.sendall(encode_control({"op": "bogus", "id": 7}))  # its reply is left unread
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        readable, _, _ = select.select([ours], [], [], 0.1)
        if readable:  # the reply is queued for us: closing now resets the connection
            break
    ours.close()
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr.decode()[-2000:]
    assert b"Traceback" not in stderr
