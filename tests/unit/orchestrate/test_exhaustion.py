"""Running out of memory or disk anywhere in a run is one line naming the resource and the resume."""

from __future__ import annotations

import asyncio
import operator
import socket

import pytest

from reprorl.errors import ResourceExhaustedError
from reprorl.orchestrate.run.exhaustion import CallbackExhaustion, exhausted


@pytest.mark.parametrize(
    ("exc", "resource"),
    [
        (OSError(28, "No space left on device"), "disk"),
        (RuntimeError("(sqlite3.OperationalError) database or disk is full"), "disk"),
        (MemoryError(), "memory"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"), "memory"),
        (type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory"), "memory"),
        (RuntimeError("could not create a primitive"), "memory"),
        (RuntimeError("std::bad_alloc"), "memory"),
        (RuntimeError("can't start new thread"), "memory"),
    ],
)
def test_running_out_of_memory_or_disk_is_one_line_naming_the_resume(exc: Exception, resource: str) -> None:
    try:
        try:
            raise exc
        except Exception as inner:
            raise ValueError("while writing a part") from inner  # found down the chain as well
    except ValueError as outer:
        failure = exhausted(outer, "RUN1", "/store")
    assert isinstance(failure, ResourceExhaustedError) and failure.resource == resource
    assert "reprorl run --resume RUN1" in str(failure) and "\n" not in str(failure)
    assert ("/store" in str(failure)) == (resource == "disk")


def test_other_failures_are_not_taken_for_exhaustion() -> None:
    assert exhausted(RuntimeError("shape mismatch"), "RUN1", "/store") is None
    assert exhausted(OSError(13, "Permission denied"), "RUN1", "/store") is None


def test_a_callback_out_of_memory_stops_the_task_instead_of_spinning() -> None:
    """A reader whose callback cannot take its message is called again at once, for ever; asyncio
    only logs each time. The first exhaustion cancels the task, and the watch holds it."""
    calls = 0
    ours, theirs = socket.socketpair()
    theirs.send(b"x")  # readable until someone takes the byte, which the callback never does

    def reader() -> None:
        nonlocal calls
        calls += 1
        raise MemoryError

    async def run() -> CallbackExhaustion:
        loop = asyncio.get_running_loop()
        with CallbackExhaustion() as watch:
            loop.add_reader(ours.fileno(), reader)
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                pass
            finally:
                loop.remove_reader(ours.fileno())
        return watch

    watch = asyncio.run(asyncio.wait_for(run(), 10))
    ours.close()
    theirs.close()
    assert isinstance(watch.error, MemoryError) and calls >= 1
    failure = exhausted(watch.error, "RUN1", "/store")
    assert failure is not None and failure.resource == "memory"


def test_other_callback_errors_are_reported_as_before(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> CallbackExhaustion:
        with CallbackExhaustion() as watch:
            asyncio.get_running_loop().call_soon(operator.truediv, 1, 0)
            await asyncio.sleep(0.05)  # not cancelled: the run goes on
        return watch

    assert asyncio.run(run()).error is None
    assert "ZeroDivisionError" in caplog.text


_CAPPED = """
import os, resource, sys
from reprorl.orchestrate.run.exhaustion import exhausted
error = SystemError("error return without exception set")
print(exhausted(error, "RUN1", "/store") is None)
mapped = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (mapped + (16 << 20), resource.RLIM_INFINITY))
failure = exhausted(error, "RUN1", "/store")
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print(failure is not None and failure.resource == "memory")
"""


def test_an_unnamed_error_near_the_address_space_cap_is_put_down_to_memory() -> None:
    """A C extension that fails an allocation may raise SystemError: with the process at its cap it
    is memory, without a cap the same error stays as raised."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _CAPPED], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "True"], out.stderr
