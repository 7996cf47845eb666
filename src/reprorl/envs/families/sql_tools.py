"""The SQL family's sandboxed tools over the episode's `shop.db`, and the function that builds it.

Every call opens its own connection: queries read through a read-only connection, writes run in
one transaction that is rolled back if anything refuses it. The sandbox imports this module, so
it stays free of the env machinery.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from reprorl.envs.common import workspace_path
from reprorl.envs.errors import InvalidArguments, UnsafeAction
from reprorl.envs.families.sql_data import DB_NAME, TABLE_BY_NAME, TABLES
from reprorl.envs.families.sql_guard import (
    MAX_DB_PAGES,
    READ_PRAGMAS,
    READ_VERBS,
    WRITE_VERBS,
    Guard,
    Statement,
    engine_errors,
    parse_statement,
    refuse_nondeterministic,
    refuse_unsafe,
)
from reprorl.envs.tool import tool
from reprorl.types import Permission

MAX_ROWS_SHOWN = 30
MAX_ROWS_COUNTED = 1000
MAX_CELL_CHARS = 80
MAX_LINE_CHARS = 400
SAMPLE_ROWS = 3
MASS_CHANGE_MIN_ROWS = 4
"""A statement that changes every row of a table this large is treated as a runaway WHERE (`WHERE 1`)."""


def _connect(ctx: Any, *, writes: bool) -> sqlite3.Connection:
    path = workspace_path(ctx, DB_NAME)
    if not path.is_file():
        raise FileNotFoundError(f"the database {DB_NAME} does not exist in the workspace")
    mode = "rw" if writes else "ro"
    conn = sqlite3.connect(
        f"{path.as_uri()}?mode={mode}", uri=True, isolation_level=None, cached_statements=0
    )
    # Temporary b-trees stay in memory: the workspace (also TMPDIR) holds only the task's state.
    conn.execute("PRAGMA temp_store = MEMORY")
    if writes:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA max_page_count = {MAX_DB_PAGES}")
    else:
        conn.execute("PRAGMA query_only = ON")
    return conn


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return f"<blob, {len(value)} bytes>"
    text = str(value).replace("\n", "\\n")
    return text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 1] + "…"


def _line(cells: list[str]) -> str:
    line = " | ".join(cells)
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 1] + "…"


def format_table(columns: list[str], rows: list[tuple[Any, ...]], *, counted_all: bool = True) -> str:
    """A compact text table: a header, at most MAX_ROWS_SHOWN rows, and a footer with the row count."""
    lines = [_line(columns)] + [_line([_cell(v) for v in row]) for row in rows[:MAX_ROWS_SHOWN]]
    count = len(rows)
    if not counted_all:
        lines.append(f"(showing {MAX_ROWS_SHOWN} of more than {count - 1} rows)")
    elif count > MAX_ROWS_SHOWN:
        lines.append(f"(showing {MAX_ROWS_SHOWN} of {count} rows; {count - MAX_ROWS_SHOWN} left out)")
    else:
        lines.append(f"({count} row{'' if count == 1 else 's'})")
    return "\n".join(lines)


def _checked(sql: str) -> Statement:
    statement = parse_statement(sql)
    refuse_unsafe(statement)
    refuse_nondeterministic(statement)
    return statement


@tool(Permission.READ, params={"sql": "One read-only SQL statement, e.g. SELECT name, stock FROM products."})
def sql_query(ctx: Any, sql: str) -> str:
    """Run one read-only SELECT on the shop database and return the rows as a text table.

    At most 30 rows are shown; the footer says how many there were.
    """
    statement = _checked(sql)
    pragma = statement.pragma
    if statement.verb in WRITE_VERBS:
        raise InvalidArguments("sql_query is read-only; use sql_execute for INSERT, UPDATE and DELETE")
    if statement.verb not in READ_VERBS and not (pragma and pragma[0] in READ_PRAGMAS):
        raise InvalidArguments(f"sql_query runs SELECT statements; {statement.verb} is not supported here")
    conn = _connect(ctx, writes=False)
    try:
        guard = Guard(writes=False)
        guard.install(conn)
        with engine_errors(guard):
            cursor = conn.execute(sql)
            columns = [d[0] for d in cursor.description or ()]
            rows = cursor.fetchmany(MAX_ROWS_COUNTED + 1)
        return format_table(columns, rows, counted_all=len(rows) <= MAX_ROWS_COUNTED)
    finally:
        conn.close()


def _mass_change(conn: sqlite3.Connection, guard: Guard, affected: int) -> str | None:
    for table, action in guard.written.items():
        if action not in ("UPDATE", "DELETE") or affected < MASS_CHANGE_MIN_ROWS:
            continue
        quoted = table.replace('"', '""')
        remaining = int(conn.execute(f'SELECT count(*) FROM "{quoted}"').fetchone()[0])
        if action == "DELETE" and remaining == 0:
            return f"the statement would delete every row of {table}"
        if action == "UPDATE" and affected >= remaining:
            return f"the statement would change every row of {table}"
    return None


@tool(
    Permission.WRITE,
    params={"sql": "One INSERT, UPDATE or DELETE statement; UPDATE and DELETE need a WHERE clause."},
)
def sql_execute(ctx: Any, sql: str) -> str:
    """Run one INSERT, UPDATE or DELETE on the shop database, commit it, and say how many rows changed."""
    statement = _checked(sql)
    if statement.verb in READ_VERBS or statement.pragma is not None:
        raise InvalidArguments("sql_execute changes data; use sql_query to read")
    if statement.verb not in WRITE_VERBS:
        raise InvalidArguments(
            f"sql_execute runs one INSERT, UPDATE or DELETE; {statement.verb} is not supported"
        )
    conn = _connect(ctx, writes=True)
    try:
        conn.execute("BEGIN IMMEDIATE")
        guard = Guard(writes=True)
        guard.install(conn)
        with engine_errors(guard):
            cursor = conn.execute(sql)
            columns = [d[0] for d in cursor.description or ()]
            returned = cursor.fetchall()  # RETURNING rows; the change is complete only once all are read
            affected = max(cursor.rowcount, 0)
            Guard.uninstall(conn)
            refusal = _mass_change(conn, guard, affected)
        if refusal is not None:
            raise UnsafeAction(refusal)
        conn.execute("COMMIT")
    finally:
        Guard.uninstall(conn)  # the guard refuses transaction control, including our own ROLLBACK
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.close()
    summary = f"{affected} row{'' if affected == 1 else 's'} affected."
    return summary if not columns else summary + "\n" + format_table(columns, returned)


def _tables(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    query = (
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
    )
    return [(str(name), str(sql)) for name, sql in conn.execute(query)]


def _count(conn: sqlite3.Connection, table: str) -> int:
    quoted = table.replace('"', '""')
    return int(conn.execute(f'SELECT count(*) FROM "{quoted}"').fetchone()[0])


@tool(Permission.READ)
def list_tables(ctx: Any) -> str:
    """List the tables of the shop database with their row counts."""
    conn = _connect(ctx, writes=False)
    try:
        return "\n".join(f"{name} ({_count(conn, name)} rows)" for name, _ in _tables(conn)) or "(no tables)"
    finally:
        conn.close()


@tool(Permission.READ, params={"name": "A table name from list_tables."})
def describe_table(ctx: Any, name: str) -> str:
    """Show a table's definition (columns, types, constraints), its row count and a few sample rows."""
    conn = _connect(ctx, writes=False)
    try:
        tables = dict(_tables(conn))
        if name not in tables:
            raise InvalidArguments(f"no table {name!r}; tables: {', '.join(tables) or 'none'}")
        quoted = name.replace('"', '""')
        cursor = conn.execute(f'SELECT * FROM "{quoted}" ORDER BY rowid LIMIT {SAMPLE_ROWS}')
        sample = format_table([d[0] for d in cursor.description], cursor.fetchall())
        sample = sample.rsplit("\n", 1)[0]  # the sample's own row count would mislead
        return f"{tables[name]}\n{_count(conn, name)} rows; the first {SAMPLE_ROWS}:\n{sample}"
    finally:
        conn.close()


def build_state(ctx: Any, setup: dict[str, Any]) -> str:
    """Create `shop.db` from a task's setup (`{"tables": {name: rows}}`); run by the env, not the agent."""
    tables = setup.get("tables") if isinstance(setup, dict) else None
    if not isinstance(tables, dict) or set(tables) != set(TABLE_BY_NAME):
        raise ValueError(f"setup must be {{'tables': ...}} with exactly the tables {sorted(TABLE_BY_NAME)}")
    path: Path = workspace_path(ctx, DB_NAME)
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        for table in TABLES:
            conn.execute(table.ddl)
            marks = ", ".join("?" * len(table.columns))
            conn.executemany(f"INSERT INTO {table.name} VALUES ({marks})", tables[table.name])
        conn.execute("COMMIT")
    finally:
        conn.close()
    return f"built {DB_NAME}: " + ", ".join(f"{t.name} {len(tables[t.name])} rows" for t in TABLES)
