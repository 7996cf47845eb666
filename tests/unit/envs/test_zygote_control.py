"""The zygote's control socket under load: many senders waiting on a full socket all get through."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from reprorl.envs.sandbox.protocol import decode_control
from reprorl.envs.sandbox.zygote import ZygoteClient


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
