"""The SQL text of a rollout query: a user's condition checked to be exactly one condition, the names
and values it is built from quoted, and a run cut into windows of steps to read whole records by.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

from reprorl.errors import UserInputError
from reprorl.store.rollouts import COLUMNS, SUMMARY_COLUMNS, PartFile


def step_windows(
    parts: Sequence[PartFile], target_bytes: int | None, max_files: int | None = None
) -> list[tuple[list[PartFile], tuple[int, int]]]:
    """Consecutive step spans, each closed once it holds about `target_bytes` of part files (a
    compacted part's bytes spread evenly over its steps) or `max_files` files, with the parts that
    hold rows of each; a step is never split, so a span may exceed either."""
    weight: dict[int, float] = {}
    starting: dict[int, int] = {}
    for part in parts:
        last = _last(part)
        share = part.size / (last - part.step + 1)
        starting[part.step] = starting.get(part.step, 0) + 1
        for step in range(part.step, last + 1):
            weight[step] = weight.get(step, 0.0) + share
    spans: list[tuple[int, int]] = []
    first, held, files = None, 0.0, 0
    for step in sorted(weight):
        first = step if first is None else first
        held += weight[step]
        files += starting.get(step, 0)
        if (target_bytes is not None and held >= target_bytes) or (
            max_files is not None and files >= max_files
        ):
            spans.append((first, step))
            first, held, files = None, 0.0, 0
    if first is not None:
        spans.append((first, max(weight)))
    return [([p for p in parts if p.step <= hi and _last(p) >= lo], (lo, hi)) for lo, hi in spans]


def _last(part: PartFile) -> int:
    return part.step if part.last_step is None else part.last_step


def check_single_condition(con: duckdb.DuckDBPyConnection, sql: str, reference: str, ends_at: int) -> None:
    """Refuse WHERE text that changes anything but the WHERE clause (a `)` then UNION, ORDER, ...).

    `ends_at` is where the user's text ends in `sql`: a syntax error past it is reported as an
    unfinished condition rather than as a token the user never wrote.
    """
    if tree(con, sql, ends_at) != tree(con, reference, len(reference)):
        raise UserInputError(
            "must be one condition on the rollout columns; it may not close the parenthesis "
            "or add clauses or statements",
            field="where",
        )


def tree(con: duckdb.DuckDBPyConnection, sql: str, ends_at: int) -> Any:
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
    return without_positions({**node, "where_clause": None})


def without_positions(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_positions(v) for k, v in value.items() if k != "query_location"}
    if isinstance(value, list):
        return [without_positions(v) for v in value]
    return value


def explain(exc: duckdb.Error) -> str:
    message = first_line(exc)
    if isinstance(exc, duckdb.PermissionException):
        return f"may read only the rollout table, no other files ({message})"
    hint = [line for line in str(exc).splitlines() if line.startswith("Candidate bindings:")]
    return f"{message} {hint[0]}" if hint else message


def column_list(columns: Sequence[str] | str | None) -> tuple[str, ...]:
    if columns is None:
        return SUMMARY_COLUMNS
    names = [c.strip() for c in columns.split(",")] if isinstance(columns, str) else list(columns)
    names = [c for c in names if c]
    unknown = [c for c in names if c not in COLUMNS]
    if unknown or not names:
        what = f"unknown column {unknown[0]!r}" if unknown else "no columns given"
        raise UserInputError(f"{what}; known: {', '.join(COLUMNS)}", field="columns")
    return tuple(names)


def limit_clause(limit: int | None) -> str:
    if limit is None:
        return ""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise UserInputError(f"must be an integer >= 0, not {limit!r}", field="limit")
    return f" LIMIT {limit}"


def offset_clause(offset: int) -> str:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise UserInputError(f"must be an integer >= 0, not {offset!r}", field="offset")
    return f" OFFSET {offset}" if offset else ""


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def sql_type(kind: pa.DataType) -> str:
    """DuckDB's name for an Arrow type of the rollout schema."""
    if pa.types.is_map(kind):
        return f"MAP({sql_type(kind.key_type)}, {sql_type(kind.item_type)})"
    if pa.types.is_list(kind):
        return f"{sql_type(kind.value_type)}[]"
    if pa.types.is_struct(kind):
        return f"STRUCT({declared(kind)})"
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


def declared(fields: pa.Schema | pa.StructType) -> str:
    return ", ".join(f"{quote(f.name)} {sql_type(f.type)}" for f in fields)
