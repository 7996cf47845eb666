"""Test harness for the sandbox: an event loop on a background thread, so one pool serves many tests.

pytest has no event loop of its own here; starting a pool (a zygote interpreter) for every test
would cost most of a second each, so a module-scoped pool runs on this loop instead.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from reprorl.envs.sandbox import SandboxPool
from reprorl.envs.sandbox.confine import uid_processes

__all__ = [
    "IS_ROOT",
    "TOOLS",
    "TOOLS_DIR",
    "LoopThread",
    "needs_root",
    "running_pool",
    "sandbox_root",
    "uid_processes",
]

T = TypeVar("T")

TOOLS = "sandbox_tools"
TOOLS_DIR = Path(__file__).resolve().parent
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not IS_ROOT, reason="needs root: dedicated uids, network and PID namespaces (CI runs as root)"
)


class LoopThread:
    """An asyncio loop running forever on a daemon thread; `run` executes a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sandbox-test-loop", daemon=True)
        self._thread.start()

    def run(self, awaitable: Awaitable[T], timeout: float = 60.0) -> T:
        async def wait() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wait(), self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@contextmanager
def sandbox_root() -> Iterator[Path]:
    """A pool root under /tmp: a sandbox uid must pass through every directory above it, and pytest's
    own tmp dirs are private to root."""
    root = Path(tempfile.mkdtemp(prefix="reprorl-sbx-test-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def running_pool(runner: LoopThread, **options: Any) -> Iterator[SandboxPool]:
    with sandbox_root() as root:
        pool = SandboxPool([TOOLS], sys_path=[TOOLS_DIR], **{"root": root, **options})
        runner.run(pool.start())
        try:
            yield pool
        finally:
            runner.run(pool.aclose())
