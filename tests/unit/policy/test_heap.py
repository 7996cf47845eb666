"""The heap policy: freed large buffers go back to the OS, so a process's RSS follows its live memory."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = """
import sys
import torch
if sys.argv[1] == "bounded":
    from reprorl.policy.heap import bound_heap
    assert bound_heap()

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024

base = rss_mb()
# Buffers of changing sizes freed in between, as sampling and training allocate them all run long,
# with small survivors allocated after each, which pin the heap above the freed holes.
keep = []
for i in range(600):
    transient = torch.empty(4_000_000 + 650_000 * (i % 40), dtype=torch.uint8).fill_(1)
    keep.append(torch.empty(65536 + i, dtype=torch.uint8).fill_(1))
    del transient
live = sum(t.numel() for t in keep) // 2**20
print(rss_mb() - base - live)  # MB held beyond what is alive
"""


def _growth(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True, timeout=120
    )
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_bounded_heap_returns_freed_buffers() -> None:
    default, bounded = _growth("default"), _growth("bounded")
    assert bounded < 12, f"RSS holds {bounded} MB beyond the live buffers"
    assert default > bounded + 25, (default, bounded)  # the control: without it, RSS climbs
