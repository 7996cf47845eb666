"""The package's public surface: every exported name resolves, and importing it stays light."""

from __future__ import annotations

import subprocess
import sys

import reprorl


def test_every_exported_name_resolves() -> None:
    missing = [name for name in reprorl.__all__ if not hasattr(reprorl, name)]
    assert missing == []
    assert reprorl.__version__ != "0.0.0"


def test_import_does_not_pull_in_torch() -> None:
    # The records and the store are used by tools that never train; they must not pay for torch.
    code = "import sys, reprorl; print('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False"


def test_import_starts_no_thread() -> None:
    # A sandbox child imports reprorl and then enters a new user namespace, which the kernel refuses
    # to a process with more than one thread; numpy's BLAS starts its pool on import.
    code = (
        "import reprorl, sys; "
        "threads = open('/proc/self/status').read().split('Threads:')[1].split()[0]; "
        "print(threads, 'numpy' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["1", "False"]
