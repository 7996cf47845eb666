"""Querying a run's rollouts with DuckDB, inside a connection that can read only the verified part files.

Every query re-lists the run's part files, verifies each one (checksum, schema version, run and step;
a file is re-hashed only when its inode, size or mtime changed since this store last checked it),
and opens a fresh in-memory DuckDB connection whose only view is `rollouts` over exactly those
files (over a window of consecutive steps at a time where the run has many files or whole records
are read: `rollout_sql.step_windows`). External access is then switched off and the configuration
locked, so user SQL can neither read other files nor write any. A user's WHERE text must be one
expression: the query is parsed with and without it, and the two trees may differ only in the WHERE
clause.
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from pydantic import ValidationError

from reprorl.errors import NotFoundError, RecordError, UserInputError
from reprorl.store.log_tail import LogTail
from reprorl.store.rollout_sql import (
    check_single_condition,
    column_list,
    declared,
    explain,
    first_line,
    limit_clause,
    literal,
    offset_clause,
    quote,
    step_windows,
)
from reprorl.store.rollouts import (
    COMPACTED_EVENT,
    DISCARDED_EVENT,
    SCHEMA,
    WRITTEN_EVENT,
    PartFile,
    find_compacted,
    find_parts,
    run_location,
    verify_part,
)
from reprorl.store.runs import RunRecord
from reprorl.types import Trajectory

VIEW = "rollouts"
# Reading whole records goes by windows of consecutive steps of about this many bytes of part files;
# every query by windows of at most this many files (DuckDB's scan state grows with files x columns).
WINDOW_BYTES = 64 * 2**20
WINDOW_FILES = 512
ORDER = "ORDER BY step, rollout_id"
_STAT = tuple[int, int, int]
# Raised by the engine for what the query's text asked for, not for what the files hold.
_USER_ERRORS = (
    duckdb.ParserException,
    duckdb.BinderException,
    duckdb.CatalogException,
    duckdb.ConversionException,
    duckdb.InvalidInputException,
    duckdb.PermissionException,
    duckdb.OutOfRangeException,
    duckdb.NotImplementedException,
    duckdb.TypeMismatchException,
)


class RolloutStore:
    """A run's rollouts as one SQL table: filter with a WHERE text, get Arrow tables or trajectories."""

    def __init__(
        self, run: RunRecord | Path, *, timeout_s: float | None = None, memory_limit: str | None = None
    ) -> None:
        """`timeout_s` interrupts a query that runs longer (a server answering strangers sets it);
        `memory_limit` (DuckDB's form, e.g. "1GB") bounds what one query may hold."""
        self.run_dir, self.run_id, _ = run_location(run)
        self.timeout_s, self.memory_limit = timeout_s, memory_limit
        self._verified: dict[Path, tuple[_STAT, PartFile]] = {}
        self._log = LogTail(self.run_dir / "events.jsonl", keep=False)
        self._logged: set[Path] = set()
        self._replaced: set[Path] = set()
        self._snapshot: tuple[frozenset[Path], frozenset[Path]] = (frozenset(), frozenset())
        self._ledger_lock = threading.Lock()

    # -- files ---------------------------------------------------------------------------------

    def parts(self) -> list[PartFile]:
        """The run's part files, each verified; raises on a corrupt, foreign or missing part."""
        # The log is read before the folder is listed: a writer renames its part before it logs
        # it, so every part named in what was read is already visible to the listing.
        logged, replaced = self.ledger()
        found: list[tuple[Path, int, int | None, str]] = [
            (p, step, None, d) for p, step, d in find_parts(self.run_dir) if p not in replaced
        ]
        # A compacted part counts once its compaction is logged: one left by a compaction killed
        # before its log line would count its rows twice beside the parts it was to replace.
        found += [(p, first, last, d) for p, first, last, d in find_compacted(self.run_dir) if p in logged]
        missing = logged - {path for path, *_ in found}
        if missing:
            name = min(missing).relative_to(self.run_dir)
            raise RecordError(f"run {self.run_id}: rollout part {name} was written, now missing")
        parts = []
        for path, step, last_step, digest in found:
            stat = path.stat()
            key = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            cached = self._verified.get(path)
            if cached is None or cached[0] != key:
                cached = (key, verify_part(path, step, digest, self.run_id, last_step))
                self._verified[path] = cached
            parts.append(cached[1])
        return parts

    def ledger(self) -> tuple[AbstractSet[Path], AbstractSet[Path]]:
        """From the run's event log: the parts that hold its rollouts now, and the parts a compaction
        replaced (still on disk only if it was killed before it removed them). Empty without a log.

        The log is append-only: each call folds in only the lines appended since the last one, so a
        query's cost does not grow with the number of parts ever written.
        """
        with self._ledger_lock:
            new, restarted = self._log.read_new()
            if restarted:
                self._logged, self._replaced = set(), set()
            logged, replaced = self._logged, self._replaced
            for e in new:
                kind = e.get("event")
                if kind == WRITTEN_EVENT and e.get("part"):
                    logged.add(self.run_dir / str(e["part"]))
                elif kind == DISCARDED_EVENT:
                    logged.difference_update(self.run_dir / str(p) for p in e.get("parts", []))
                elif kind == COMPACTED_EVENT:
                    merged = {self.run_dir / str(p) for p in e.get("replaces", [])}
                    logged -= merged
                    replaced |= merged
                    logged.add(self.run_dir / str(e["part"]))
            if new or restarted:  # the caller gets a snapshot, taken again only when the log grew
                self._snapshot = (frozenset(logged), frozenset(replaced))
            return self._snapshot

    # -- queries -------------------------------------------------------------------------------

    def query(
        self,
        where: str | None = None,
        *,
        columns: Sequence[str] | str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> pa.Table:
        """Rows matching the SQL condition `where`, ordered by step and rollout id.

        `columns` defaults to every column but `record` (the full JSON); see docs/rollouts.md.
        `offset` skips that many matching rows first (a page of a table).
        """
        selected = column_list(columns)
        limit_clause(limit), offset_clause(offset)  # refused before anything is read
        sql = f"SELECT {', '.join(quote(c) for c in selected)} FROM {VIEW}"
        windows = self._windows(None)
        if len(windows) == 1:  # the engine skips the offset itself
            files, steps = windows[0]
            tail = f"{ORDER}{limit_clause(limit)}{offset_clause(offset)}"
            with self._run(sql, where, tail, parts=files, steps=steps) as result:
                return result.to_arrow_table()
        need = None if limit is None else offset + limit
        tables: list[pa.Table] = []
        for files, steps in windows:
            held = sum(t.num_rows for t in tables)
            if tables and need is not None and held >= need:
                break
            tail = f"{ORDER}{limit_clause(None if need is None else need - held)}"
            with self._run(sql, where, tail, parts=files, steps=steps) as result:
                tables.append(result.to_arrow_table())
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        return table.slice(offset, limit)

    def count(self, where: str | None = None) -> int:
        total = 0
        for files, steps in self._windows(None):
            with self._run(f"SELECT count(*) FROM {VIEW}", where, "", parts=files, steps=steps) as result:
                row = result.fetchone()
            total += int(row[0]) if row else 0
        return total

    def get(self, rollout_id: str) -> Trajectory:
        """The exact stored trajectory with this rollout id."""
        with self._connect() as con:
            rows = con.execute(
                f"SELECT record FROM {VIEW} WHERE rollout_id = $rollout_id", {"rollout_id": rollout_id}
            ).fetchall()
        if not rows:
            raise NotFoundError(f"no rollout {rollout_id!r} in run {self.run_id}")
        if len(rows) > 1:  # even identical copies: every query would count the rollout twice
            raise RecordError(f"run {self.run_id}: rollout {rollout_id!r} is stored {len(rows)} times")
        return _restore(rows[0][0], rollout_id)

    def trajectories(self, where: str | None = None, *, limit: int | None = None) -> Iterator[Trajectory]:
        """The stored trajectories matching `where`, restored one batch of rows at a time.

        The run is read in windows of consecutive steps of about `WINDOW_BYTES` of part files, each
        sorted on its own (windows never share a step): reading every trajectory of a run holds one
        window's records, whatever the run's size.
        """
        limit_clause(limit)  # refused before anything is read
        sql = f"SELECT rollout_id, record FROM {VIEW}"
        remaining = limit
        for files, steps in self._windows(WINDOW_BYTES):
            if remaining == 0:
                return
            tail = f"{ORDER}{limit_clause(remaining)}"
            with self._run(sql, where, tail, parts=files, steps=steps) as result:
                for batch in result.to_arrow_reader(1024):
                    ids, records = batch.column(0).to_pylist(), batch.column(1).to_pylist()
                    for rollout_id, record in zip(ids, records, strict=True):
                        yield _restore(record, rollout_id)
                        if remaining is not None:
                            remaining -= 1

    def to_pandas(
        self,
        where: str | None = None,
        *,
        columns: Sequence[str] | str | None = None,
        limit: int | None = None,
    ) -> Any:
        """`query(...)` as a pandas DataFrame; pandas is optional and not installed with reprorl."""
        if importlib.util.find_spec("pandas") is None:
            raise UserInputError("pandas is not installed: `pip install pandas`, or use query() for Arrow")
        return self.query(where, columns=columns, limit=limit).to_pandas()

    # -- the sandboxed connection --------------------------------------------------------------

    def _windows(self, target_bytes: int | None) -> list[tuple[list[PartFile], tuple[int, int] | None]]:
        """The run's verified parts cut into windows of consecutive steps, each of at most
        `WINDOW_FILES` files (and about `target_bytes` if given): a query over thousands of small
        parts holds one window's scan state at a time. One window without a span when it is all."""
        parts = self.parts()
        if len(parts) <= WINDOW_FILES and (
            target_bytes is None or sum(p.size for p in parts) <= target_bytes
        ):
            return [(parts, None)]
        return [(files, span) for files, span in step_windows(parts, target_bytes, WINDOW_FILES)]

    def _connect(
        self, parts: list[PartFile] | None = None, steps: tuple[int, int] | None = None
    ) -> duckdb.DuckDBPyConnection:
        parts = self.parts() if parts is None else parts
        # A window's span is part of the view, never of the query text a user's condition joins.
        within = "" if steps is None else f" WHERE step BETWEEN {int(steps[0])} AND {int(steps[1])}"
        con = duckdb.connect(
            ":memory:",
            config={
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
                "temp_directory": "",  # no spilling to disk: a query never writes a file
                "python_enable_replacements": False,  # a name in SQL never reaches a Python variable
                **({"memory_limit": self.memory_limit} if self.memory_limit else {}),
            },
        )
        try:
            if parts:
                files = "[" + ", ".join(literal(str(p.path)) for p in parts) + "]"
                con.execute(f"SET allowed_paths = {files}")
                # `step` is a column of every file; a folder name is not read as one (a compacted
                # part's folder names a span of steps).
                con.execute(
                    f"CREATE VIEW {VIEW} AS SELECT * FROM read_parquet({files}, hive_partitioning = false)"
                    + within
                )
            else:
                # Declared in SQL, not scanned from an empty Arrow table: Arrow's scanner waits on a
                # thread of its own pool, and waits for ever where that thread cannot be created
                # (an address-space limit reached).
                con.execute(f"CREATE TABLE {VIEW} ({declared(SCHEMA)})")
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
        except BaseException:
            con.close()
            raise
        return con

    @contextlib.contextmanager
    def _run(
        self,
        head: str,
        where: str | None,
        tail: str,
        *,
        parts: list[PartFile] | None = None,
        steps: tuple[int, int] | None = None,
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        """Execute `head [WHERE (where)] tail` on a sandboxed connection, yield it for fetching;
        over `parts` only (default: every part), and within the span `steps` if given."""
        where = (where or "").strip() or None
        with self._connect(parts, steps) as con, _deadline(con, self.timeout_s):
            try:
                if where is None:
                    result = con.execute(f"{head} {tail}")
                else:
                    opening = f"{head} WHERE (\n"
                    sql = f"{opening}{where}\n) {tail}"
                    ends_at = len(opening) + len(where)
                    check_single_condition(con, sql, f"{head} WHERE (TRUE) {tail}", ends_at)
                    result = con.execute(sql)
                yield result  # inside the try: a streamed result can fail while it is fetched
            except duckdb.InterruptException:
                what = f"the query ran past its {self.timeout_s:g} s limit"
                if where is None:
                    raise RecordError(f"run {self.run_id}: {what}") from None
                raise UserInputError(f"{what}; narrow the condition", field="where") from None
            except duckdb.OutOfMemoryException:
                if self.memory_limit is None:
                    raise  # the process is out of memory, not over a limit of the query's own
                what = f"the query needed more than its {self.memory_limit} memory limit"
                if where is None:
                    raise RecordError(f"run {self.run_id}: {what}") from None
                raise UserInputError(f"{what}; narrow the condition", field="where") from None
            except _USER_ERRORS as exc:
                if where is None:
                    raise self._failed(exc) from None
                raise UserInputError(explain(exc), field="where") from None
            except duckdb.Error as exc:
                raise self._failed(exc) from None

    def _failed(self, exc: duckdb.Error) -> RecordError:
        return RecordError(f"run {self.run_id}: rollout query failed: {first_line(exc)}")


@contextlib.contextmanager
def _deadline(con: duckdb.DuckDBPyConnection, seconds: float | None) -> Iterator[None]:
    """Interrupt whatever `con` runs once `seconds` have passed (no limit when None)."""
    if seconds is None:
        yield
        return
    timer = threading.Timer(seconds, con.interrupt)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _restore(record: str, rollout_id: str) -> Trajectory:
    try:
        return Trajectory.model_validate_json(record)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "record"
        raise RecordError(f"rollout {rollout_id}: invalid record at {where}: {first['msg']}") from None
