"""Querying a run's rollouts with DuckDB, inside a connection that can read only the verified part files.

Every query re-lists the run's part files, verifies each one (checksum, schema version, run and step;
a file is re-hashed only when its inode, size or mtime changed since this store last checked it),
and opens a fresh in-memory DuckDB connection whose only view is `rollouts` over exactly those
files. External access is then switched off and the configuration locked, so user SQL can neither
read other files nor write any. A user's WHERE text must be one expression: the query is parsed
with and without it, and the two trees may differ only in the WHERE clause.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
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
from reprorl.store.rollouts import (
    COLUMNS,
    COMPACTED_EVENT,
    DISCARDED_EVENT,
    SCHEMA,
    SUMMARY_COLUMNS,
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
        selected = _columns(columns)
        sql = f"SELECT {', '.join(_quote(c) for c in selected)} FROM {VIEW}"
        with self._run(sql, where, f"{ORDER}{_limit(limit)}{_offset(offset)}") as result:
            return result.to_arrow_table()

    def count(self, where: str | None = None) -> int:
        with self._run(f"SELECT count(*) FROM {VIEW}", where, "") as result:
            row = result.fetchone()
        return int(row[0]) if row else 0

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
        """The stored trajectories matching `where`, restored one batch of rows at a time."""
        sql = f"SELECT rollout_id, record FROM {VIEW}"
        with self._run(sql, where, f"{ORDER}{_limit(limit)}") as result:
            for batch in result.to_arrow_reader(1024):
                ids, records = batch.column(0).to_pylist(), batch.column(1).to_pylist()
                for rollout_id, record in zip(ids, records, strict=True):
                    yield _restore(record, rollout_id)

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

    def _connect(self) -> duckdb.DuckDBPyConnection:
        parts = self.parts()
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
                files = "[" + ", ".join(_literal(str(p.path)) for p in parts) + "]"
                con.execute(f"SET allowed_paths = {files}")
                # `step` is a column of every file; a folder name is not read as one (a compacted
                # part's folder names a span of steps).
                con.execute(
                    f"CREATE VIEW {VIEW} AS SELECT * FROM read_parquet({files}, hive_partitioning = false)"
                )
            else:
                # Declared in SQL, not scanned from an empty Arrow table: Arrow's scanner waits on a
                # thread of its own pool, and waits for ever where that thread cannot be created
                # (an address-space limit reached).
                con.execute(f"CREATE TABLE {VIEW} ({_declared(SCHEMA)})")
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
        except BaseException:
            con.close()
            raise
        return con

    @contextlib.contextmanager
    def _run(self, head: str, where: str | None, tail: str) -> Iterator[duckdb.DuckDBPyConnection]:
        """Execute `head [WHERE (where)] tail` on a sandboxed connection, yield it for fetching."""
        where = (where or "").strip() or None
        with self._connect() as con, _deadline(con, self.timeout_s):
            try:
                if where is None:
                    result = con.execute(f"{head} {tail}")
                else:
                    opening = f"{head} WHERE (\n"
                    sql = f"{opening}{where}\n) {tail}"
                    ends_at = len(opening) + len(where)
                    _check_single_condition(con, sql, f"{head} WHERE (TRUE) {tail}", ends_at)
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
                raise UserInputError(_explain(exc), field="where") from None
            except duckdb.Error as exc:
                raise self._failed(exc) from None

    def _failed(self, exc: duckdb.Error) -> RecordError:
        return RecordError(f"run {self.run_id}: rollout query failed: {_first_line(exc)}")


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


def _check_single_condition(con: duckdb.DuckDBPyConnection, sql: str, reference: str, ends_at: int) -> None:
    """Refuse WHERE text that changes anything but the WHERE clause (a `)` then UNION, ORDER, ...).

    `ends_at` is where the user's text ends in `sql`: a syntax error past it is reported as an
    unfinished condition rather than as a token the user never wrote.
    """
    if _tree(con, sql, ends_at) != _tree(con, reference, len(reference)):
        raise UserInputError(
            "must be one condition on the rollout columns; it may not close the parenthesis "
            "or add clauses or statements",
            field="where",
        )


def _tree(con: duckdb.DuckDBPyConnection, sql: str, ends_at: int) -> Any:
    row = con.execute("SELECT json_serialize_sql($sql)", {"sql": sql}).fetchone()
    tree: dict[str, Any] = json.loads(row[0]) if row else {"error": True, "error_message": "no parse tree"}
    if tree.get("error"):
        message = " ".join(str(tree.get("error_message", "cannot be parsed")).split())
        position = str(tree.get("position", ""))
        if position.isdigit() and int(position) > ends_at:
            message = "it ends too early (an unclosed parenthesis or quote, or a missing operand?)"
        raise UserInputError(f"not a single SQL condition: {message}", field="where")
    statements = tree.get("statements", [])
    if len(statements) != 1:
        raise UserInputError("must be one condition, not several statements", field="where")
    node = statements[0].get("node", {})
    return _without_positions({**node, "where_clause": None})


def _without_positions(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_positions(v) for k, v in value.items() if k != "query_location"}
    if isinstance(value, list):
        return [_without_positions(v) for v in value]
    return value


def _explain(exc: duckdb.Error) -> str:
    message = _first_line(exc)
    if isinstance(exc, duckdb.PermissionException):
        return f"may read only the rollout table, no other files ({message})"
    hint = [line for line in str(exc).splitlines() if line.startswith("Candidate bindings:")]
    return f"{message} {hint[0]}" if hint else message


def _restore(record: str, rollout_id: str) -> Trajectory:
    try:
        return Trajectory.model_validate_json(record)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "record"
        raise RecordError(f"rollout {rollout_id}: invalid record at {where}: {first['msg']}") from None


def _columns(columns: Sequence[str] | str | None) -> tuple[str, ...]:
    if columns is None:
        return SUMMARY_COLUMNS
    names = [c.strip() for c in columns.split(",")] if isinstance(columns, str) else list(columns)
    names = [c for c in names if c]
    unknown = [c for c in names if c not in COLUMNS]
    if unknown or not names:
        what = f"unknown column {unknown[0]!r}" if unknown else "no columns given"
        raise UserInputError(f"{what}; known: {', '.join(COLUMNS)}", field="columns")
    return tuple(names)


def _limit(limit: int | None) -> str:
    if limit is None:
        return ""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise UserInputError(f"must be an integer >= 0, not {limit!r}", field="limit")
    return f" LIMIT {limit}"


def _offset(offset: int) -> str:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise UserInputError(f"must be an integer >= 0, not {offset!r}", field="offset")
    return f" OFFSET {offset}" if offset else ""


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _sql_type(kind: pa.DataType) -> str:
    """DuckDB's name for an Arrow type of the rollout schema."""
    if pa.types.is_map(kind):
        return f"MAP({_sql_type(kind.key_type)}, {_sql_type(kind.item_type)})"
    if pa.types.is_list(kind):
        return f"{_sql_type(kind.value_type)}[]"
    if pa.types.is_struct(kind):
        return f"STRUCT({_declared(kind)})"
    names = {
        pa.int32(): "INTEGER",
        pa.int64(): "BIGINT",
        pa.float64(): "DOUBLE",
        pa.bool_(): "BOOLEAN",
        pa.string(): "VARCHAR",
    }
    if kind not in names:
        raise TypeError(f"no DuckDB type for Arrow {kind} in the rollout schema")
    return names[kind]


def _declared(fields: pa.Schema | pa.StructType) -> str:
    return ", ".join(f"{_quote(f.name)} {_sql_type(f.type)}" for f in fields)
