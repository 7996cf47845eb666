"""An append-only run log read incrementally: each read parses only the lines appended since the last.

A run's `metrics.jsonl` and `events.jsonl` only grow, so a reader that keeps its byte offset never
parses a line twice; a line still being written waits for its newline. A file that was replaced or
shrank is read again from its start, and the caller is told so it can drop what it derived.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprorl.store.runs import parse_log_line


@dataclass
class LogTail:
    """One log and what was read of it; `keep` False hands each new record out once and keeps none."""

    path: Path
    keep: bool = True
    records: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: list[int] = field(default_factory=list)
    lines: int = 0
    _offset: int = 0
    _inode: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def refresh(self) -> int:
        """Read what was appended since the last call; returns how many new records."""
        return len(self.read_new()[0])

    def read_new(self) -> tuple[list[dict[str, Any]], bool]:
        """(the intact records appended since the last read, whether the log was read from its start
        again because it was replaced or shrank: what was derived from earlier records is stale)."""
        with self._lock:
            try:
                stat = self.path.stat()
            except FileNotFoundError:
                restarted = self._offset > 0
                self._reset(None)
                return [], restarted
            restarted = False
            if stat.st_ino != self._inode or stat.st_size < self._offset:
                restarted = self._offset > 0
                self._reset(stat.st_ino)
            if stat.st_size == self._offset:
                return [], restarted
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read(stat.st_size - self._offset)
            end = data.rfind(b"\n") + 1  # a line without its newline is still being written
            new: list[dict[str, Any]] = []
            for raw in data[:end].splitlines():
                self.lines += 1
                record = parse_log_line(raw)
                if record is None:
                    self.bad_lines.append(self.lines)
                else:
                    new.append(record)
            self._offset += end
            if self.keep:
                self.records.extend(new)
            return new, restarted

    def _reset(self, inode: int | None) -> None:
        self.records, self.bad_lines, self.lines, self._offset, self._inode = [], [], 0, 0, inode
