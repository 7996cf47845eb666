"""Atomic, durable file writes: a reader sees the old file or the whole new one, never a part."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def fsync_dir(path: Path) -> None:
    """Make a rename or create inside `path` survive a power cut."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(target: Path, *, tmp_dir: Path | None = None, mode: int = 0o644) -> Iterator[IO[bytes]]:
    """Write to a temp file beside `target` (or in `tmp_dir`, same filesystem), fsync, rename.

    If the block raises or the process dies, `target` is untouched; a leftover temp file is named
    `.tmp-*` and is swept by the store's cleanup.
    """
    directory = tmp_dir or target.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        tmp.chmod(mode)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.replace(target)
        fsync_dir(target.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(target: Path, data: bytes, *, mode: int = 0o644) -> None:
    with atomic_writer(target, mode=mode) as handle:
        handle.write(data)


def append_durable(target: Path, line: bytes) -> None:
    """Append one line and fsync; a crash can at most leave a torn last line, which readers skip."""
    fd = os.open(target, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # end a torn last line first, so this line stays whole
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
