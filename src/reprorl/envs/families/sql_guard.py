"""What SQL an agent may run: one statement, classified before it runs and policed while it runs.

Two independent checks stand between the agent and the database. Before anything runs, a small
tokenizer (which knows about strings, quoted names and comments, so a `;` or `DROP` inside a
literal fools nothing) finds the statement's verb and refuses what is destructive. While it runs,
an sqlite3 authorizer denies the same operations at the engine level, a progress handler stops
runaway queries, and size limits stop giant values; whatever the tokenizer missed, the engine
still refuses.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from reprorl.envs.errors import InvalidArguments, UnsafeAction

MAX_SQL_CHARS = 4000
MAX_VM_STEPS = 5_000_000
PROGRESS_EVERY = 1000
MAX_VALUE_BYTES = 100_000
MAX_DB_PAGES = 2560  # 10 MiB at the default page size

WRITE_VERBS = frozenset({"INSERT", "UPDATE", "DELETE", "REPLACE"})
READ_VERBS = frozenset({"SELECT", "VALUES"})
UNSAFE_VERBS = frozenset({"DROP", "ALTER", "ATTACH", "DETACH", "VACUUM"})
READ_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "foreign_key_list"}
)
_NONDETERMINISTIC = frozenset({"random", "randomblob"})
_CLOCK_FUNCTIONS = frozenset({"date", "time", "datetime", "julianday", "unixepoch", "strftime"})


class QueryTooExpensive(Exception):
    """The statement ran past its step budget and was stopped (classified as a tool exception)."""


@dataclass(frozen=True)
class Token:
    kind: str
    """`word`, `string`, `name` (a quoted identifier), `number` or `punct`."""
    text: str
    depth: int
    """Parenthesis depth: clauses of the statement itself sit at depth 0, subqueries deeper."""


@dataclass(frozen=True)
class Statement:
    """One SQL statement and what the tokenizer learned about it."""

    sql: str
    tokens: tuple[Token, ...]
    verb: str
    """The operation it performs: for `WITH ... DELETE` this is DELETE, not WITH."""

    @property
    def pragma(self) -> tuple[str, bool] | None:
        """For a PRAGMA: its name and whether it sets a value (`= x` or `(x)`)."""
        if self.verb != "PRAGMA":
            return None
        rest = list(self.tokens[1:])
        if len(rest) >= 3 and rest[1].text == ".":
            rest = rest[2:]  # a schema prefix, as in `main.table_info`
        if not rest:
            return "", False
        return rest[0].text.lower(), len(rest) > 1 and rest[1].text in ("=", "(")


def tokenize(sql: str) -> list[Token]:
    """Split SQL into tokens, skipping comments; raises InvalidArguments on unterminated literals."""
    tokens: list[Token] = []
    depth, i, n = 0, 0, len(sql)
    closing = {"'": "'", '"': '"', "`": "`", "[": "]"}
    while i < n:
        c = sql[i]
        if c.isspace():
            i += 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end == -1 else end + 1
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = n if end == -1 else end + 2
        elif c in closing:
            end = i + 1
            while True:
                end = sql.find(closing[c], end)
                if end == -1:
                    raise InvalidArguments(f"unterminated {c} at character {i + 1}")
                if c != "[" and sql.startswith(closing[c] * 2, end):
                    end += 2  # a doubled quote is an escaped quote
                    continue
                break
            kind = "string" if c == "'" else "name"
            tokens.append(
                Token(kind, sql[i + 1 : end].replace(c * 2, c) if c != "[" else sql[i + 1 : end], depth)
            )
            i = end + 1
        elif c.isalpha() or c == "_":
            j = i + 1
            while j < n and (sql[j].isalnum() or sql[j] in "_$"):
                j += 1
            tokens.append(Token("word", sql[i:j], depth))
            i = j
        elif c.isdigit():
            j = i + 1
            while j < n and (sql[j].isalnum() or sql[j] == "."):
                j += 1
            tokens.append(Token("number", sql[i:j], depth))
            i = j
        else:
            if c == ")":
                depth = max(0, depth - 1)
            tokens.append(Token("punct", c, depth))
            if c == "(":
                depth += 1
            i += 1
    return tokens


def parse_statement(sql: str) -> Statement:
    """The single statement in `sql`; more than one is refused as unsafe, none as invalid."""
    if len(sql) > MAX_SQL_CHARS:
        raise InvalidArguments(f"SQL longer than {MAX_SQL_CHARS} characters")
    tokens = tokenize(sql)
    while tokens and tokens[-1].text == ";" and tokens[-1].kind == "punct":
        tokens.pop()
    if any(t.kind == "punct" and t.text == ";" for t in tokens):
        # Piggybacked statements are the classic way to smuggle a write past a check.
        raise UnsafeAction("only one SQL statement per call is allowed")
    if not tokens:
        raise InvalidArguments("no SQL statement given")
    first = tokens[0].text.upper() if tokens[0].kind == "word" else ""
    verb = first
    if first == "WITH":
        main = [t.text.upper() for t in tokens[1:] if t.depth == 0 and t.kind == "word"]
        verb = next((w for w in main if w in READ_VERBS | WRITE_VERBS), "WITH")
    return Statement(sql=sql, tokens=tuple(tokens), verb=verb or "?")


def refuse_unsafe(statement: Statement) -> None:
    """Raise UnsafeAction for statements that could destroy data beyond any task."""
    verb = statement.verb
    if verb in UNSAFE_VERBS:
        raise UnsafeAction(f"{verb} statements are not allowed")
    pragma = statement.pragma
    if pragma is not None and pragma[1] and pragma[0] not in READ_PRAGMAS:
        raise UnsafeAction(f"PRAGMA {pragma[0]} would change database settings")
    if verb in ("UPDATE", "DELETE"):
        start = next(i for i, t in enumerate(statement.tokens) if t.kind == "word" and t.text.upper() == verb)
        after = statement.tokens[start + 1 :]
        if not any(t.depth == 0 and t.kind == "word" and t.text.upper() == "WHERE" for t in after):
            raise UnsafeAction(f"{verb} without a WHERE clause would change every row")


def refuse_nondeterministic(statement: Statement) -> None:
    """Tool results must depend only on the state, so clocks and randomness are refused."""
    tokens = statement.tokens
    for i, token in enumerate(tokens):
        if token.kind == "string" and token.text.strip().lower() == "now":
            raise InvalidArguments("'now' is not available: the database's clock is fixed; use literal dates")
        lower = token.text.lower()
        if token.kind == "word" and lower in _CLOCK_FUNCTIONS and tokens[i + 1 : i + 3]:
            following = [t.text for t in tokens[i + 1 : i + 3]]
            if following == ["(", ")"]:
                raise InvalidArguments(f"{lower}() without arguments reads the clock; pass a literal date")


@dataclass
class Guard:
    """The engine-level policy for one call: what the authorizer denied and which tables were written."""

    writes: bool
    denied: list[tuple[str, bool]] = field(default_factory=list)
    """(what, unsafe) for each denied operation."""
    written: dict[str, str] = field(default_factory=dict)
    """Table name -> INSERT / UPDATE / DELETE, for the tables the statement writes."""
    steps: int = 0

    def install(self, conn: sqlite3.Connection) -> None:
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_CHARS * 4)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.set_progress_handler(self._progress, PROGRESS_EVERY)
        conn.set_authorizer(self._authorize)

    @staticmethod
    def uninstall(conn: sqlite3.Connection) -> None:
        conn.set_authorizer(None)
        conn.set_progress_handler(None, 0)

    def _progress(self) -> int:
        self.steps += PROGRESS_EVERY
        return 1 if self.steps > MAX_VM_STEPS else 0

    def _deny(self, what: str, unsafe: bool) -> int:
        self.denied.append((what, unsafe))
        return sqlite3.SQLITE_DENY

    def _authorize(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, source: str | None
    ) -> int:
        if action in _UNSAFE_ACTIONS:
            return self._deny(_UNSAFE_ACTIONS[action], True)
        if action == sqlite3.SQLITE_PRAGMA:
            name = (arg1 or "").lower()
            if name in READ_PRAGMAS:
                return sqlite3.SQLITE_OK
            return self._deny(f"PRAGMA {name}", arg2 is not None)
        if action == sqlite3.SQLITE_FUNCTION:
            if (arg2 or "").lower() in _NONDETERMINISTIC:
                return self._deny(f"the nondeterministic function {arg2}()", False)
            if (arg2 or "").lower() == "load_extension":
                return self._deny("load_extension()", True)
            return sqlite3.SQLITE_OK
        if action in _WRITE_ACTIONS:
            table = arg1 or ""
            if table.lower().startswith("sqlite_"):
                return self._deny(f"writing the system table {table}", True)
            if not self.writes:
                return self._deny(f"{_WRITE_ACTIONS[action]} in a read-only query", False)
            self.written.setdefault(table, _WRITE_ACTIONS[action])
            return sqlite3.SQLITE_OK
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        return self._deny(_OTHER_ACTIONS.get(action, f"operation {action}"), False)

    def explain(self, error: sqlite3.Error) -> Exception:
        """The exception to raise for an engine error: unsafe, invalid (the statement's own fault:
        its syntax, names, types or constraints), too expensive, or the engine's (I/O, locks, memory,
        a damaged file), which stays a tool exception."""
        if self.denied:
            what, unsafe = next(((w, u) for w, u in self.denied if u), self.denied[0])
            return (
                UnsafeAction(f"{what} is not allowed")
                if unsafe
                else InvalidArguments(f"{what} is not allowed")
            )
        if self.steps > MAX_VM_STEPS:
            return QueryTooExpensive(
                f"the statement was stopped after {MAX_VM_STEPS:,} steps; narrow it (a WHERE clause, a LIMIT)"
            )
        if statement_fault(error):
            return InvalidArguments(str(error))
        return error


# Result codes (primary, before any extended suffix) that say what is wrong with the statement.
_STATEMENT_CODES = frozenset(
    {"SQLITE_ERROR", "SQLITE_CONSTRAINT", "SQLITE_MISMATCH", "SQLITE_RANGE", "SQLITE_TOOBIG"}
)


# The sqlite3 module's own errors about the statement it was given (a closed connection or a
# cursor used from another thread would be the tool's bug).
_CALLER_MISUSE = ("You can only execute one statement at a time", "Incorrect number of bindings")


def statement_fault(error: sqlite3.Error) -> bool:
    """Whether an engine error is the caller's: a statement that does not parse, names a column or
    table the database lacks, breaks a constraint or misuses the API (two statements, missing
    bindings). Caller mistakes are invalid arguments, which the record attributes to the model; a
    tool exception would say the tool broke."""
    name = getattr(error, "sqlite_errorname", None)
    if name is None:  # raised by the Python module itself: only its complaints about the statement
        return isinstance(error, sqlite3.ProgrammingError) and str(error).startswith(_CALLER_MISUSE)
    return "_".join(str(name).split("_")[:2]) in _STATEMENT_CODES


_UNSAFE_ACTIONS: dict[int, str] = {
    sqlite3.SQLITE_DROP_TABLE: "DROP TABLE",
    sqlite3.SQLITE_DROP_INDEX: "DROP INDEX",
    sqlite3.SQLITE_DROP_TRIGGER: "DROP TRIGGER",
    sqlite3.SQLITE_DROP_VIEW: "DROP VIEW",
    sqlite3.SQLITE_DROP_TEMP_TABLE: "DROP TABLE",
    sqlite3.SQLITE_DROP_TEMP_INDEX: "DROP INDEX",
    sqlite3.SQLITE_DROP_TEMP_TRIGGER: "DROP TRIGGER",
    sqlite3.SQLITE_DROP_TEMP_VIEW: "DROP VIEW",
    sqlite3.SQLITE_DROP_VTABLE: "DROP TABLE",
    sqlite3.SQLITE_ALTER_TABLE: "ALTER TABLE",
    sqlite3.SQLITE_ATTACH: "ATTACH",
    sqlite3.SQLITE_DETACH: "DETACH",
}
_WRITE_ACTIONS: dict[int, str] = {
    sqlite3.SQLITE_INSERT: "INSERT",
    sqlite3.SQLITE_UPDATE: "UPDATE",
    sqlite3.SQLITE_DELETE: "DELETE",
}
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_READ, sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE})
_OTHER_ACTIONS: dict[int, str] = {
    sqlite3.SQLITE_TRANSACTION: "transaction control (each call is its own transaction)",
    sqlite3.SQLITE_SAVEPOINT: "SAVEPOINT (each call is its own transaction)",
    sqlite3.SQLITE_CREATE_TABLE: "CREATE TABLE",
    sqlite3.SQLITE_CREATE_INDEX: "CREATE INDEX",
    sqlite3.SQLITE_CREATE_TRIGGER: "CREATE TRIGGER",
    sqlite3.SQLITE_CREATE_VIEW: "CREATE VIEW",
    sqlite3.SQLITE_CREATE_TEMP_TABLE: "CREATE TEMP TABLE",
    sqlite3.SQLITE_CREATE_TEMP_INDEX: "CREATE TEMP INDEX",
    sqlite3.SQLITE_CREATE_TEMP_TRIGGER: "CREATE TEMP TRIGGER",
    sqlite3.SQLITE_CREATE_TEMP_VIEW: "CREATE TEMP VIEW",
    sqlite3.SQLITE_CREATE_VTABLE: "CREATE VIRTUAL TABLE",
    sqlite3.SQLITE_REINDEX: "REINDEX",
    sqlite3.SQLITE_ANALYZE: "ANALYZE",
}


@contextmanager
def engine_errors(guard: Guard) -> Iterator[None]:
    """Turn engine errors raised inside the block into the exception the guard explains."""
    try:
        yield
    except sqlite3.Error as exc:
        raise guard.explain(exc) from None
