"""A process's own peak resident memory, and a reset so that each phase of a bench gets its own peak.

Not `getrusage(RUSAGE_SELF).ru_maxrss`: Linux carries that across fork and exec (a child of a parent
that has just written a million rollouts would report the parent's peak as its own), and it cannot be
reset. `VmHWM` in /proc/self/status is the process's own and is reset by writing 5 to clear_refs.
"""

from __future__ import annotations

import contextlib
from pathlib import Path


def peak_rss_mib() -> float:
    """This process's high-water RSS since it started or since the last `reset_peak_rss()`."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")  # not Linux: no figure rather than a wrong one


def reset_peak_rss() -> None:
    """Start a new high-water mark at the current RSS (Linux 4.0 and later; a no-op elsewhere)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
