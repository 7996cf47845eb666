"""The reaper of a local Ray cluster: when the run that started it dies, so do the cluster's processes.

Ray's node agents (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) outlive a driver killed with SIGKILL
(its raylet dies, they are re-parented to init and stay). A run that starts its own cluster
(`--ray local`) starts this reaper beside it, in a session of its own so the kill does not reach it:
`python -m reprorl.orchestrate.pipeline.ray_reaper DRIVER_PID`. It keeps a list of the driver's
descendants, each by pid and start time, and once the driver is gone kills those still alive (the
start time guards against a reused pid), then exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.5


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every live descendant of `root`: pid → start time."""
    table: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (info := _stat(int(entry.name))) is not None:
            table[int(entry.name)] = info
    found: dict[int, int] = {}
    frontier = {root}
    while frontier:
        frontier = {pid for pid, (parent, _) in table.items() if parent in frontier and pid not in found}
        found |= {pid: table[pid][1] for pid in frontier}
    return found


def watch(driver: int) -> None:
    started = _stat(driver)
    if started is None:
        return
    known: dict[int, int] = {}
    while (now := _stat(driver)) is not None and now[1] == started[1]:
        known.update(descendants(driver))
        known = {pid: t for pid, t in known.items() if (info := _stat(pid)) is not None and info[1] == t}
        time.sleep(POLL_S)
    for pid, start in known.items():
        info = _stat(pid)
        if info is not None and info[1] == start and pid != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def start_reaper() -> subprocess.Popen[bytes]:
    """Start the reaper of this process's local Ray cluster."""
    package_parent = str(Path(__file__).resolve().parents[3])  # the folder holding `reprorl`
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "reprorl.orchestrate.pipeline.ray_reaper", str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )


if __name__ == "__main__":
    watch(int(sys.argv[1]))
