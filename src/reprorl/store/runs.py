"""Run records: the folder `runs/<run_id>/` that says exactly what a run was and what it did.

A record holds the resolved spec and its hash, the code (git commit, dirty flag, diff), the
software (Python and package versions), the hardware, the seeds, the start and end, the status,
and two append-only logs: `metrics.jsonl` and `events.jsonl`. JSON documents are written
atomically; each log line carries a checksum so a torn or edited line is detected on read.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from reprorl.errors import RecordError, RunNotFoundError
from reprorl.hashing import canonical_json, content_hash, sha256_hex
from reprorl.store.atomic import append_durable, fsync_dir, write_atomic
from reprorl.store.environment import capture_environment
from reprorl.store.home import Store
from reprorl.store.registry import RunEntry

RunStatus = Literal["created", "running", "succeeded", "failed", "stopped"]
FINAL_STATUSES = frozenset({"succeeded", "failed", "stopped"})
RECORD_FORMAT = "reprorl.run/1"
IMMUTABLE_FILES = ("spec.json", "run.json")
# The kept policy versions' index (orchestrate/run/kept_versions.py writes it): each line names the
# store object holding one version's tensors.
VERSIONS_FILE = "versions.jsonl"
IMPORT_FILE = "import.json"  # in a run folder imported from a bundle: which bundle, what it left out


_last_id_time = datetime.min.replace(tzinfo=UTC)
_id_lock = threading.Lock()

LogName = Literal["metrics", "event"]
RunObserver = Callable[["RunRecord", LogName, dict[str, Any]], None]
"""Called with the record, which log took the line, and a copy of the line, once it is on disk."""

_observers: list[RunObserver] = []
_observers_lock = threading.Lock()


# What `new_run_id` makes; anything else named as a run id is refused before a path is built from it.
RUN_ID_RE = re.compile(r"\d{8}T\d{12}Z-[0-9a-f]{6}")


def new_run_id(now: datetime | None = None) -> str:
    """Unique and sortable by creation time: UTC timestamp to the microsecond, then random hex.

    Within one process, ids made in the same microsecond get successive microseconds, so their
    order is their creation order; the random part keeps processes apart.
    """
    global _last_id_time
    with _id_lock:
        now = max(now or datetime.now(UTC), _last_id_time + timedelta(microseconds=1))
        _last_id_time = now
    return f"{now:%Y%m%dT%H%M%S%fZ}-{secrets.token_hex(3)}"


def _now() -> str:
    return datetime.now(UTC).isoformat()


def checksummed_line(record: dict[str, Any]) -> bytes:
    """One record as a run-log line: the record and the checksum `read_log` verifies."""
    body = canonical_json(record, allow_nan=True)
    return (
        json.dumps({"sha": sha256_hex(body.encode())[:16], "rec": record}, sort_keys=True) + "\n"
    ).encode()


@dataclass(frozen=True)
class LogReadResult:
    records: list[dict[str, Any]]
    bad_lines: list[int]


def read_log(path: Path) -> LogReadResult:
    """Every intact record of a JSONL log, and the line numbers of torn or altered lines."""
    records: list[dict[str, Any]] = []
    bad: list[int] = []
    if not path.exists():
        return LogReadResult(records, bad)
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            record = parse_log_line(raw)
            if record is None:
                bad.append(number)
            else:
                records.append(record)
    return LogReadResult(records, bad)


def parse_log_line(raw: bytes) -> dict[str, Any] | None:
    """The record of one run-log line, or None when the line is torn or does not match its checksum."""
    try:
        wrapped = json.loads(raw)
        record = wrapped["rec"]
        if not isinstance(record, dict):
            return None
        if sha256_hex(canonical_json(record, allow_nan=True).encode())[:16] != wrapped["sha"]:
            return None
        return record
    except (ValueError, KeyError, TypeError):
        return None


class RunRecord:
    """Read and append to one run's folder."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.path = store.runs_dir / run_id
        if not (self.path / "run.json").is_file():
            raise RunNotFoundError(f"no run {run_id!r} under {store.runs_dir}")

    # -- creation ------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        store: Store,
        *,
        spec: dict[str, Any],
        spec_hash: str,
        name: str,
        seeds: dict[str, int],
        inputs: dict[str, str] | None = None,
        run_id: str | None = None,
    ) -> RunRecord:
        """Write a new run folder in one step (staged, then renamed) and index it."""
        if content_hash(spec) != spec_hash:
            raise RecordError(f"spec hash {spec_hash} does not match the spec's content")
        run_id = run_id or new_run_id()
        store.runs_dir.mkdir(parents=True, exist_ok=True)
        final = store.runs_dir / run_id
        if final.exists():
            raise RecordError(f"run {run_id} already exists")
        staging = store.runs_dir / f".tmp-{run_id}"
        _sweep_staging(store.runs_dir)
        shutil.rmtree(staging, ignore_errors=True)  # a killed earlier attempt at this very id
        started = _now()
        info = {
            "format": RECORD_FORMAT,
            "run_id": run_id,
            "name": name,
            "spec_hash": spec_hash,
            "seeds": seeds,
            "inputs": inputs or {},
            "created_at": started,
            "environment": capture_environment(),
        }
        try:
            staging.mkdir()
            write_atomic(staging / "spec.json", (canonical_json(spec) + "\n").encode())
            write_atomic(staging / "run.json", _pretty(info))
            sums = {n: sha256_hex((staging / n).read_bytes()) for n in IMMUTABLE_FILES}
            write_atomic(staging / "checksums.json", _pretty(sums))
            write_atomic(
                staging / "status.json",
                _pretty({"status": "created", "updated_at": started, "ended_at": None}),
            )
            for log in ("metrics.jsonl", "events.jsonl"):
                (staging / log).touch()
            fsync_dir(staging)
            staging.rename(final)
            fsync_dir(store.runs_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        store.registry.add_run(
            RunEntry(
                run_id,
                name,
                spec_hash,
                "created",
                str(final),
                datetime.fromisoformat(started),
                None,
            ),
            inputs or {},
        )
        record = cls(store, run_id)
        record.event("run_created", spec_hash=spec_hash)
        return record

    # -- reading -------------------------------------------------------------------------------

    def verify(self) -> None:
        """Raise if a file written at creation no longer matches its recorded checksum."""
        sums = _read_json(self.path / "checksums.json")
        for name in IMMUTABLE_FILES:
            try:
                actual = sha256_hex((self.path / name).read_bytes())
            except FileNotFoundError:
                raise RecordError(f"run {self.run_id}: {name} is missing") from None
            if actual != sums.get(name):
                raise RecordError(f"run {self.run_id}: {name} was altered after creation")

    def info(self) -> dict[str, Any]:
        self.verify()
        return _read_json(self.path / "run.json")

    def spec(self) -> dict[str, Any]:
        """The resolved spec, checked against the hash recorded at creation."""
        spec = _read_json(self.path / "spec.json")
        expected = self.info()["spec_hash"]
        if content_hash(spec) != expected:
            raise RecordError(f"run {self.run_id}: spec.json no longer matches its hash {expected}")
        return spec

    def status(self) -> dict[str, Any]:
        return _read_json(self.path / "status.json")

    def metrics(self) -> LogReadResult:
        return read_log(self.path / "metrics.jsonl")

    def events(self) -> LogReadResult:
        return read_log(self.path / "events.jsonl")

    # -- appending -----------------------------------------------------------------------------

    def log_metrics(self, step: int, values: dict[str, float], **extra: Any) -> None:
        line = {"step": step, "time": _now(), **extra, **values}
        append_durable(self.path / "metrics.jsonl", checksummed_line(line))
        self._notify("metrics", line)

    def event(self, kind: str, **fields: Any) -> None:
        line = {"event": kind, "time": _now(), **fields}
        append_durable(self.path / "events.jsonl", checksummed_line(line))
        self._notify("event", line)

    # -- observers -----------------------------------------------------------------------------

    @staticmethod
    def add_observer(observer: RunObserver) -> None:
        """Call `observer` after each metrics line and event that any run record of this process writes.

        Observers watch and never change what is recorded. One that raises is removed and an
        `observer_failed` event names it, so a faulty observer cannot stop a run.
        """
        with _observers_lock:
            _observers.append(observer)

    @staticmethod
    def remove_observer(observer: RunObserver) -> None:
        with _observers_lock, contextlib.suppress(ValueError):
            _observers.remove(observer)

    @staticmethod
    @contextlib.contextmanager
    def observing(observer: RunObserver) -> Iterator[None]:
        """`add_observer` for the length of a `with` block."""
        RunRecord.add_observer(observer)
        try:
            yield
        finally:
            RunRecord.remove_observer(observer)

    def _notify(self, log: LogName, line: dict[str, Any]) -> None:
        with _observers_lock:
            observers = tuple(_observers)
        for observer in observers:
            try:
                observer(self, log, dict(line))
            except Exception as exc:
                RunRecord.remove_observer(observer)
                name = getattr(observer, "__qualname__", type(observer).__qualname__)
                self.event("observer_failed", observer=name, error=f"{type(exc).__name__}: {exc}"[:500])

    def set_status(self, status: RunStatus, **details: Any) -> None:
        if status not in ("created", "running", *FINAL_STATUSES):
            raise RecordError(f"unknown run status {status!r}")
        ended = _now() if status in FINAL_STATUSES else None
        body = {"status": status, "updated_at": _now(), "ended_at": ended, **details}
        write_atomic(self.path / "status.json", _pretty(body))
        if not self.store.registry.has_run(self.run_id):
            self._reindex()  # the process died between writing the folder and indexing it
        self.store.registry.set_run_status(
            self.run_id, status, datetime.fromisoformat(ended) if ended else None
        )
        self.event("status", status=status, **details)

    def _reindex(self) -> None:
        info = self.info()
        created = datetime.fromisoformat(info["created_at"])
        entry = RunEntry(
            self.run_id, info["name"], info["spec_hash"], "created", str(self.path), created, None
        )
        self.store.registry.add_run(entry, info["inputs"])

    def write_json(self, name: str, value: Any) -> Path:
        """Write an extra record document into the run folder, atomically."""
        if "/" in name or name.startswith("."):
            raise RecordError(f"record name {name!r} must be a plain file name")
        target = self.path / name
        write_atomic(target, _pretty(value))
        return target


def _sweep_staging(runs_dir: Path, older_than_s: float = 3600.0) -> None:
    """Remove run folders that a killed `create` left half-staged."""
    cutoff = time.time() - older_than_s
    for path in runs_dir.glob(".tmp-*"):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < cutoff:
                shutil.rmtree(path, ignore_errors=True)


def iter_runs(store: Store) -> Iterator[str]:
    """Run ids found on disk, newest first (ids sort by creation time)."""
    if not store.runs_dir.is_dir():
        return
    for entry in sorted(store.runs_dir.iterdir(), reverse=True):
        if not entry.name.startswith(".") and (entry / "run.json").is_file():
            yield entry.name


def find_run(store: Store, prefix: str) -> RunRecord:
    """A run by its id or a unique prefix of it."""
    matches = [r for r in iter_runs(store) if r.startswith(prefix)] if prefix else []
    if len(matches) == 1 or prefix in matches:
        return RunRecord(store, prefix if prefix in matches else matches[0])
    if not matches:
        raise RunNotFoundError(f"no run matches {prefix!r} under {store.runs_dir}")
    raise RunNotFoundError(f"{prefix!r} matches {len(matches)} runs; give more of the id")


def _pretty(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, default=str) + "\n").encode()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise RecordError(f"{path} is missing") from None
    except ValueError as exc:
        raise RecordError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise RecordError(f"{path} does not hold a JSON object")
    return value
