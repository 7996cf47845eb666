"""What the dashboard reads: one store, opened once, and per run its logs and rollouts, read incrementally.

A run's metrics and events logs are append-only, so each is read once and then only from where the
last read stopped (`LogTail`); a line still being written waits for its newline. Rollout part files
are verified once per inode, size and mtime by the run's `RolloutStore`, kept for the server's life.
Nothing here writes to the store.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprorl.dashboard.security import checked_run_id, inside, refuse
from reprorl.errors import ReprorlError
from reprorl.report.records import task_index
from reprorl.store import RunRecord, Store, iter_runs
from reprorl.store.log_tail import LogTail
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import Task


@dataclass(frozen=True)
class Built:
    """Something built from a run's records, the state of the records it saw, and what it cost."""

    key: tuple[Any, ...]
    value: Any
    seconds: float
    at: float


@dataclass
class RunCache:
    """One run as the dashboard keeps it between requests."""

    record: RunRecord
    metrics: LogTail
    events: LogTail
    rollouts: RolloutStore
    _tasks: dict[str, Task] | None = None
    _built: dict[str, Built] = field(default_factory=dict)
    _build_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def built(self, name: str, build: Callable[[], Any], *, patience: float = 5.0) -> Any:
        """`build()`'s value, rebuilt only when the run's records changed since it was built, and then
        not sooner than `patience` times its own build time after the last build: a large run that is
        still writing costs a bounded share of the server, however often its page asks."""
        key = (self.metrics.lines, self.events.lines, self.status().get("status"))
        with self._build_lock:
            last = self._built.get(name)
            now = time.monotonic()
            # A status change (the run ended) is always shown: the page says "final" after it.
            waiting = last is not None and last.key[2] == key[2] and now - last.at < patience * last.seconds
            if last is not None and (last.key == key or waiting):
                return last.value
            start = time.perf_counter()
            value = build()
            self._built[name] = Built(key, value, time.perf_counter() - start, time.monotonic())
            return value

    def refresh(self) -> int:
        return self.metrics.refresh() + self.events.refresh()

    def info(self) -> dict[str, Any]:
        return _json(self.record.path / "run.json")

    def spec(self) -> dict[str, Any]:
        return _json(self.record.path / "spec.json")

    def status(self) -> dict[str, Any]:
        return _json(self.record.path / "status.json")

    def train_lines(self) -> list[dict[str, Any]]:
        return [
            m
            for m in self.metrics.records
            if m.get("stage") in (None, "train") and isinstance(m.get("step"), int)
        ]

    def eval_lines(self) -> list[dict[str, Any]]:
        return [
            m for m in self.metrics.records if m.get("stage") == "eval" and isinstance(m.get("step"), int)
        ]

    def tasks(self, store: Store) -> dict[str, Task]:
        if self._tasks is None:
            inputs = self.info().get("inputs") or {}
            self._tasks = task_index(store, {str(k): str(v) for k, v in inputs.items()})
        return self._tasks


class StoreReader:
    """The dashboard's one view of a store: runs by id, each cached, nothing written."""

    def __init__(
        self, store: Store, *, query_timeout_s: float | None = None, query_memory: str | None = None
    ) -> None:
        self.store = store
        self.query_timeout_s, self.query_memory = query_timeout_s, query_memory
        self._runs: dict[str, RunCache] = {}
        self._decoders: dict[str, Callable[[int], str] | None] = {}
        self._lock = threading.Lock()
        self._decoder_lock = threading.Lock()

    def decoder(self, base: str) -> Callable[[int], str] | None:
        """Token id → text for a run's base model; None when its tokenizer cannot be read here.

        The tokenizer is read from the model cache (`<store>/cache/models`), where a stored model
        folder is exported once if it is not there yet, as training does; nothing else is written.
        """
        with self._decoder_lock:  # one load per base, however many pages ask at once
            if base not in self._decoders:
                from reprorl.policy import load_tokenizer  # torch and transformers load only when asked

                try:
                    tokenizer = load_tokenizer(base, store=self.store)
                except Exception:
                    self._decoders[base] = None
                else:
                    self._decoders[base] = lambda token: str(tokenizer.decode([token]))
            return self._decoders[base]

    def run_ids(self) -> Iterator[str]:
        return iter_runs(self.store)

    def run(self, run_id: str) -> RunCache:
        """A run by its exact id; refused (400) when it is not an id, 404 when there is none."""
        checked_run_id(run_id)
        path = inside(self.store.runs_dir, run_id)
        with self._lock:
            cached = self._runs.get(run_id)
            if cached is None:
                if not (path / "run.json").is_file():
                    raise refuse("run", f"no run {run_id} in this store", status=404)
                try:
                    record = RunRecord(self.store, run_id)
                except ReprorlError as exc:
                    raise refuse("run", str(exc), status=404) from None
                cached = RunCache(
                    record,
                    LogTail(path / "metrics.jsonl"),
                    LogTail(path / "events.jsonl"),
                    RolloutStore(record, timeout_s=self.query_timeout_s, memory_limit=self.query_memory),
                )
                self._runs[run_id] = cached
        cached.refresh()
        return cached

    def label(self, address: str) -> str:
        """`name@vN` when the registry knows the hash, else the address itself."""
        from reprorl.hashing import HASH_PREFIX

        digest = address.rsplit("@", 1)[-1]
        if digest.startswith(HASH_PREFIX) and self.store.has_registry():
            try:
                return self.store.registry.lookup(None, digest=digest.removeprefix(HASH_PREFIX)).label
            except ReprorlError:
                pass
        return address


def _json(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            value = json.loads(handle.read())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
