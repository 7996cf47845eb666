"""A run that runs out of memory or disk: the failure named in one line, with the resume that continues it.

Running out of memory (a `MemoryError`, torch's allocator refusing a tensor, CUDA out of memory) or
of disk (`ENOSPC`, a quota, SQLite's "database or disk is full") is the machine's fault, not the
run's: everything it wrote is checkpointed or cut on resume like a kill, so the same run continues
once there is more of the resource. An error that names neither is put down to memory when the
process is measurably short of it (near its address-space cap, or refused a 32 MiB block), since
code that fails an allocation does not always say so; anything else stays as raised.
"""

from __future__ import annotations

import asyncio
import errno
import os
import resource
from pathlib import Path
from types import TracebackType
from typing import Any

from reprorl.errors import ResourceExhaustedError

__all__ = ["CallbackExhaustion", "exhausted"]

_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_DISK_TEXTS = ("no space left on device", "database or disk is full", "disk quota exceeded")
# oneDNN answers a failed allocation of its scratchpad with "could not create a primitive".
_MEMORY_TEXTS = (
    "can't allocate memory",
    "cannot allocate memory",
    "out of memory",
    "could not create a primitive",
    "can't start new thread",  # the new thread's stack was refused
    "std::bad_alloc",  # C++ code's refused `new`, passed on by its binding
)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 16:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


# An error raised with less address space than this left under the process's cap (or when a block
# this size cannot be had) is put down to memory, whatever it says.
_HEADROOM = 128 << 20


def _memory_short() -> bool:
    """Whether the process is out of memory now: near its address-space cap, or refused a block."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            pages = int(Path("/proc/self/statm").read_text().split()[0])
            mapped = pages * os.sysconf("SC_PAGE_SIZE")
            if soft - mapped < _HEADROOM:
                return True
        bytearray(_HEADROOM // 4)
    except MemoryError:
        return True
    except (OSError, ValueError):
        return False
    return False


def _resource(exc: BaseException) -> str | None:
    named = _named_resource(exc)
    if named is None and _memory_short():
        # Code that fails an allocation does not always say so: a C extension returning NULL
        # without an exception surfaces as SystemError, half-built objects as anything.
        return "memory"
    return named


def _named_resource(exc: BaseException) -> str | None:
    for link in _chain(exc):
        text = str(link).lower()
        if isinstance(link, OSError) and link.errno in _DISK_ERRNOS:
            return "disk"
        if any(t in text for t in _DISK_TEXTS):
            return "disk"
        # torch's OutOfMemoryError, DuckDB's OutOfMemoryException, allocators' own words.
        if isinstance(link, MemoryError) or "OutOfMemory" in type(link).__name__:
            return "memory"
        if any(t in text for t in _MEMORY_TEXTS):
            return "memory"
    return None


def exhausted(exc: BaseException, run_id: str, home: str) -> ResourceExhaustedError | None:
    """The one-line error for `exc` when it means the machine ran out of memory or disk, else None."""
    if isinstance(exc, ResourceExhaustedError):
        return exc
    resource = _resource(exc)
    if resource is None:
        return None
    detail = " ".join(str(exc).split())[:200] or type(exc).__name__
    resume = f"reprorl run --resume {run_id}"
    if resource == "disk":
        return ResourceExhaustedError(
            f"run {run_id} ran out of disk space under {home} ({detail}); nothing recorded is lost: "
            f"free space there, then {resume}",
            resource="disk",
        )
    return ResourceExhaustedError(
        f"run {run_id} ran out of memory ({detail}); it is resumable from its last checkpoint: free "
        f"memory or lower learning.tasks_per_step, learning.group_size or learning.max_tokens in a new "
        f"run, or {resume} on a machine with more",
        resource="memory",
    )


class CallbackExhaustion:
    """Stops the running task when an event-loop callback runs out of memory or disk.

    asyncio logs a callback's exception and goes on; a reader whose callback cannot take its
    message is called again at once, for ever. Entered inside the run's task, this turns the first
    such error into the task's cancellation; `error` then holds it, for the run to fail with."""

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def __enter__(self) -> CallbackExhaustion:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._previous = self._loop.get_exception_handler()
        self._loop.set_exception_handler(self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._loop.set_exception_handler(self._previous)

    def _handle(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if exc is not None and _resource(exc) is not None:
            if self.error is None:
                self.error = exc
                if self._task is not None:
                    self._task.cancel()
            return
        if self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)
