"""Compaction: an ended run's per-batch rollout parts merged into a few large parts, with nothing lost.

A run writes one part file per batch, so a long run holds thousands of small files and every query
opens, verifies and plans over all of them. `compact` merges consecutive steps' parts into parts of
about `target_bytes` each, under `rollouts/steps=<first>-<last>/part-<sha256>.parquet`, rows in
step order, encoded as every part is and checked by the sha256 in the name.

It is atomic at every point a kill can fall:
1. each input part is re-hashed as it is read, and the merged file is written to a temp name,
   fsynced and renamed: a kill here leaves a compacted part no log line names, which readers ignore
   and the next compaction removes;
2. one `rollouts_compacted` event names the new part, its checksum and rows, and the parts it
   replaces: from this line on, readers take the new part and skip the old ones;
3. the old parts are removed: a kill here leaves replaced parts that readers skip and the next
   compaction removes.
Only an ended run is compacted: a live run, and the resume of a killed one, work with per-step parts.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from reprorl.errors import IntegrityError, RecordError
from reprorl.store.atomic import fsync_dir
from reprorl.store.rollout_query import RolloutStore
from reprorl.store.rollouts import (
    COMPACTED_EVENT,
    ROLLOUTS_DIR,
    WRITE_OPTIONS,
    PartFile,
    find_compacted,
    find_parts,
    part_schema,
    step_label,
    verify_part,
)
from reprorl.store.runs import FINAL_STATUSES, RunRecord

TARGET_BYTES = 256 * 2**20  # a part this size verifies in well under a second and plans in one scan
# A row group is what DuckDB reads in parallel and skips by its statistics: large enough that the
# per-group cost vanishes, small enough that compaction holds one in memory.
ROW_GROUP_BYTES = 64 * 2**20
_MAX_ROWS = 2**30  # the byte bound above decides, not a row count
_CHUNK = 2**20


@dataclass(frozen=True)
class Compaction:
    """What one compaction did: parts and bytes before and after, rows kept, leftovers removed."""

    parts_before: int
    parts_after: int
    bytes_before: int
    bytes_after: int
    rows: int
    merged: int  # new compacted parts
    leftovers: int  # files of an earlier killed compaction removed


def check_resumable(record: RunRecord) -> None:
    """Refuse to resume a compacted run: a resume rewinds and keeps per-step parts, which it no longer has."""
    if find_compacted(record.path):
        raise RecordError(
            f"run {record.run_id} ended and its rollouts were compacted: it cannot be resumed; "
            "start a new run of its spec (`reprorl reproduce`)"
        )


def compact(record: RunRecord, *, target_bytes: int = TARGET_BYTES) -> Compaction:
    """Merge an ended run's per-step parts into parts of about `target_bytes`; see the module text."""
    status = record.status().get("status")
    if status not in FINAL_STATUSES:
        raise RecordError(
            f"run {record.run_id} is {status}: only an ended run is compacted (resume a killed run "
            "with `reprorl run --resume` first)"
        )
    if target_bytes < 1:
        raise RecordError(f"target_bytes must be >= 1, not {target_bytes}")
    with _exclusive(record.path):
        return _compact(record, target_bytes)


@contextlib.contextmanager
def _exclusive(run_dir: Path) -> Iterator[None]:
    """One compaction of a run at a time (a second would take the first's new part for a leftover)."""
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RecordError(f"run {run_dir.name} is being compacted by another process") from None
        yield
    finally:
        os.close(fd)


def _compact(record: RunRecord, target_bytes: int) -> Compaction:
    store = RolloutStore(record)
    leftovers = _remove_leftovers(store)
    before = store.parts()
    single = [p for p in before if p.last_step is None]
    walls = [p.step for p in before if p.last_step is not None]
    merged = 0
    for group in _groups(single, walls, target_bytes):
        if len(group) > 1:
            _merge(record, group)
            merged += 1
    after = RolloutStore(record).parts()
    rows_before, rows_after = sum(p.rows for p in before), sum(p.rows for p in after)
    if rows_after != rows_before:  # the log and the files disagree; nothing was removed unlogged
        raise RecordError(f"run {record.run_id}: compaction holds {rows_after} rows of {rows_before}")
    return Compaction(
        parts_before=len(before),
        parts_after=len(after),
        bytes_before=sum(p.size for p in before),
        bytes_after=sum(p.size for p in after),
        rows=rows_after,
        merged=merged,
        leftovers=leftovers,
    )


def _groups(parts: list[PartFile], walls: list[int], target_bytes: int) -> Iterator[list[PartFile]]:
    """Consecutive steps' parts, about `target_bytes` a group; a step's parts stay in one group, and
    no group spans a step already compacted (`walls`), so compacted spans never overlap."""
    by_step: dict[int, list[PartFile]] = {}
    for part in parts:
        by_step.setdefault(part.step, []).append(part)
    group: list[PartFile] = []
    size = 0
    for step in sorted(by_step):
        step_parts = by_step[step]
        step_size = sum(p.size for p in step_parts)
        crosses = bool(group) and any(group[-1].step < wall < step for wall in walls)
        if group and (size + step_size > target_bytes or crosses):
            yield group
            group, size = [], 0
        group += step_parts
        size += step_size
    if group:
        yield group


def _merge(record: RunRecord, group: list[PartFile]) -> None:
    first, last = group[0].step, group[-1].step
    label = step_label(first, last)
    schema = part_schema(record.run_id, label)
    folder = record.path / ROLLOUTS_DIR / f"steps={first:06d}-{last:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    os.close(fd)
    tmp = Path(name)
    try:
        with pq.ParquetWriter(tmp, schema, **WRITE_OPTIONS) as writer:  # type: ignore[no-untyped-call]
            # Parts become row groups of about ROW_GROUP_BYTES: a batch's part is a few dozen rows,
            # and a row group per part would keep the per-group cost that compaction is for.
            pending: list[pa.Table] = []
            held = 0
            for part in group:
                pending.append(_read_checked(part).replace_schema_metadata(schema.metadata))
                held += pending[-1].nbytes
                if held >= ROW_GROUP_BYTES:
                    writer.write_table(pa.concat_tables(pending), row_group_size=_MAX_ROWS)
                    pending, held = [], 0
            if pending:
                writer.write_table(pa.concat_tables(pending), row_group_size=_MAX_ROWS)
        digest = _fsync_and_hash(tmp)
        target = folder / f"part-{digest}.parquet"
        tmp.chmod(0o444)
        tmp.replace(target)
        fsync_dir(folder)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    merged = verify_part(target, first, digest, record.run_id, last)
    rows = sum(p.rows for p in group)
    if merged.rows != rows:
        target.unlink()
        raise RecordError(f"run {record.run_id}: merged steps {label} hold {merged.rows} of {rows} rows")
    record.event(
        COMPACTED_EVENT,
        part=target.relative_to(record.path).as_posix(),
        sha256=digest,
        rows=rows,
        bytes=merged.size,
        steps=[first, last],
        replaces=[p.path.relative_to(record.path).as_posix() for p in group],
        replaced_sha256=[p.sha256 for p in group],
    )
    for part in group:
        part.path.unlink(missing_ok=True)
    for folder_gone in {p.path.parent for p in group}:
        with contextlib.suppress(OSError):  # not empty: another part of the step stays
            folder_gone.rmdir()
    fsync_dir(record.path / ROLLOUTS_DIR)


def _read_checked(part: PartFile) -> pa.Table:
    """One part's rows, from bytes whose sha256 is checked as they are parsed (not a later file)."""
    data = part.path.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != part.sha256:
        raise IntegrityError(
            f"rollout part {part.path} changed while it was compacted: its sha256 is {actual[:16]}…",
            artifact=str(part.path),
            expected=part.sha256,
            actual=actual,
        )
    table: pa.Table = pq.read_table(pa.BufferReader(data))  # type: ignore[no-untyped-call]
    return table


def _fsync_and_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
        os.fsync(handle.fileno())
    return digest.hexdigest()


def _remove_leftovers(store: RolloutStore) -> int:
    """Remove what a killed compaction left: replaced parts still on disk, unlogged compacted parts."""
    logged, replaced = store.ledger()
    stale = [path for path, _, _ in find_parts(store.run_dir) if path in replaced]
    stale += [path for path, _, _, _ in find_compacted(store.run_dir) if path not in logged]
    stale += list((store.run_dir / ROLLOUTS_DIR).glob("steps=*/.tmp-*"))
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)
