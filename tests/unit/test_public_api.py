"""The package's public surface: every exported name resolves, and importing it stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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


def test_lazy_names_are_typed_for_type_checkers() -> None:
    # A name `__getattr__` loads is `object` to mypy unless the TYPE_CHECKING block imports it too,
    # and a user's strict type check would then reject every call of it.
    tree = ast.parse(Path(reprorl.__file__).read_text())
    typed = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for stmt in node.body
        if isinstance(stmt, ast.ImportFrom)
        for alias in stmt.names
    }
    lazy = reprorl._LAZY  # type: ignore[attr-defined]
    assert set(lazy) - typed == set()
    for name, module in lazy.items():
        assert getattr(reprorl, name).__module__.startswith(module.rsplit(".", 1)[0]), name
