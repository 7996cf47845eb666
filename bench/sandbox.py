"""Sandbox speed against baselines measured in the same run (this machine is noisy; read the ratios).

- open+close: median time to open a sandbox and close it again, against a bare `os.fork()` +
  `waitpid` of this process (the least any process-per-sandbox design can cost here).
- call: median round trip of a trivial tool call, against the same round trip over an asyncio
  stream to a forked echo process (the IPC floor, without JSON, limits or bookkeeping).

    python bench/sandbox.py [--opens 50] [--calls 500]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from reprorl.envs.sandbox import SandboxPool

TOOLS_DIR = Path(__file__).resolve().parent.parent / "tests" / "unit" / "envs"


async def _median_ms(repeat: int, step: Callable[[], Awaitable[object]]) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        await step()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def _fork_ms(repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def _echo_round_trip_ms(repeat: int) -> float:
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        while data := theirs.recv(65536):
            theirs.sendall(data)
        os._exit(0)
    theirs.close()
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    frame = b"\x00\x00\x00\x2a" + b"x" * 42

    async def round_trip() -> None:
        writer.write(frame)
        await writer.drain()
        await reader.readexactly(len(frame))

    try:
        return await _median_ms(repeat, round_trip)
    finally:
        writer.close()
        await writer.wait_closed()
        os.waitpid(pid, 0)


async def main(opens: int, calls: int) -> None:
    with tempfile.TemporaryDirectory(prefix="reprorl-bench-") as tmp:
        Path(tmp).chmod(0o711)
        async with SandboxPool(["sandbox_tools"], sys_path=[TOOLS_DIR], root=Path(tmp) / "root") as pool:

            async def open_close() -> None:
                sandbox = await pool.open()
                await sandbox.close()

            await open_close()  # warm up: first use of a uid slot, imports on first fork
            fork_ms = _fork_ms(opens)
            open_ms = await _median_ms(opens, open_close)
            async with pool.open() as sandbox:
                isolation = sandbox.isolation
                await sandbox.call("sandbox_tools:echo", {"text": "x"})
                echo_ms = await _echo_round_trip_ms(calls)
                call_ms = await _median_ms(calls, lambda: sandbox.call("sandbox_tools:echo", {"text": "x"}))
    print(f"isolation: {isolation}")
    rows = (
        ("open+close", open_ms, "ms", "bare fork+waitpid", fork_ms),
        ("call", call_ms * 1000, "us", "stream echo", echo_ms * 1000),
    )
    for name, value, unit, baseline, base in rows:
        ratio = value / base
        print(f"{name:11s} {value:8.2f} {unit}   {baseline:17s} {base:8.2f} {unit}   ratio {ratio:4.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opens", type=int, default=50, help="sandboxes to open and close")
    parser.add_argument("--calls", type=int, default=500, help="trivial calls to time")
    args = parser.parse_args()
    asyncio.run(main(args.opens, args.calls))
