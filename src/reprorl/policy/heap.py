"""Heap policy for long runs: large buffers go back to the OS when freed, so RSS follows live memory.

Sampling packs weights per batch size and allocates [batch x vocabulary] buffers whose sizes change
from call to call; training allocates [tokens x vocabulary] buffers of every size. glibc's malloc
raises its mmap threshold after such frees and then serves those sizes from the heap, whose freed
holes it keeps: a long run's RSS climbs far above what it uses (measured: 17 GB peak for a demo
that needs 5). Fixing the thresholds (`mallopt`) stops the climb; elsewhere (not glibc) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 20  # allocations from 1 MiB up are mapped, and unmapped when freed
TRIM_THRESHOLD_BYTES = 8 << 20  # free heap above 8 MiB at its top is returned


@functools.cache
def bound_heap() -> bool:
    """Set glibc's thresholds once per process; True when they were set."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
