"""A run that runs out of memory or disk: the failure named in one line, with the resume that continues it.

Running out of memory (a `MemoryError`, torch's allocator refusing a tensor, CUDA out of memory) or
of disk (`ENOSPC`, a quota, SQLite's "database or disk is full") is the machine's fault, not the
run's: everything it wrote is checkpointed or cut on resume like a kill, so the same run continues
once there is more of the resource. Anything else is not recognised and stays as raised.
"""

from __future__ import annotations

import errno

from reprorl.errors import ResourceExhaustedError

__all__ = ["exhausted"]

_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_DISK_TEXTS = ("no space left on device", "database or disk is full", "disk quota exceeded")
# oneDNN answers a failed allocation of its scratchpad with "could not create a primitive".
_MEMORY_TEXTS = (
    "can't allocate memory",
    "cannot allocate memory",
    "out of memory",
    "could not create a primitive",
)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 16:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _resource(exc: BaseException) -> str | None:
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
