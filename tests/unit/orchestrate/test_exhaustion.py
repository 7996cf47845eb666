"""Running out of memory or disk anywhere in a run is one line naming the resource and the resume."""

from __future__ import annotations

import pytest

from reprorl.errors import ResourceExhaustedError
from reprorl.orchestrate.run.exhaustion import exhausted


@pytest.mark.parametrize(
    ("exc", "resource"),
    [
        (OSError(28, "No space left on device"), "disk"),
        (RuntimeError("(sqlite3.OperationalError) database or disk is full"), "disk"),
        (MemoryError(), "memory"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"), "memory"),
        (type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory"), "memory"),
        (RuntimeError("could not create a primitive"), "memory"),
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
