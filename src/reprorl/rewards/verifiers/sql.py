"""SQLite final states: the database must hold exactly the expected rows, and answers must match.

The reference names the database file and, for every table, its columns and the digest of its
expected rows (order-independent). A change task scores 1 only when every table matches: the
intended rows changed and nothing else did. An answer task scores 1 when the answer is right and
the database is untouched. The database is opened read-only, through `FinalState.path`, so a link
planted by the agent is refused rather than followed.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass
from typing import Any

from reprorl.hashing import canonical_json, content_hash
from reprorl.rewards.base import FinalState, StateAccessError, Verifier
from reprorl.rewards.registered import register_verifier
from reprorl.rewards.verifiers.answers import answer_matches
from reprorl.types import Task

_SIDE_FILES = ("-journal", "-wal", "-shm")


def _value(value: object) -> object:
    """A database value as JSON, so that any content the agent left can be digested."""
    if isinstance(value, bytes):
        return {"blob": value.hex()}
    if isinstance(value, float) and not math.isfinite(value):
        return {"real": repr(value)}
    return value


def table_digest(columns: list[str], rows: list[list[Any]]) -> str:
    """The digest the task generator computes for a table: columns, and rows in canonical order."""
    return content_hash({"columns": columns, "rows": sorted(rows, key=canonical_json)})


@register_verifier("sqlite_state")
@dataclass(frozen=True)
class SqliteState(Verifier):
    """Scores SQL tasks from the final database file and the agent's answer."""

    max_rows: int = 100_000

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        assert isinstance(task.reference, dict), "SQL tasks carry a dict reference"
        reference: dict[str, Any] = dict(task.reference)
        expected: dict[str, Any] = reference["tables"]
        try:
            tables = self.read(state, str(reference["db"]), sorted(expected))
        except (StateAccessError, sqlite3.DatabaseError, FileNotFoundError):
            tables = None  # a missing, corrupt or linked database is a wrong state, not a verifier crash
        exact = tables is not None and set(tables) == set(expected)
        if tables is not None and exact:
            exact = all(
                tables[name][0] == spec["columns"] and table_digest(*tables[name]) == spec["digest"]
                for name, spec in expected.items()
            )
        components = {"exact_state": float(exact)}
        if reference["kind"] == "answer":
            distractors = [str(d) for d in reference.get("distractors") or []]
            right = answer_matches(state.answer or "", reference["answer"], distractors)
            components["answer"] = float(right)
            components[self.name] = float(right and exact)
        else:
            components["target_rows"] = float(tables is not None and _targets_hold(tables, reference))
            components[self.name] = float(exact)
        return components

    def read(
        self, state: FinalState, db: str, names: list[str]
    ) -> dict[str, tuple[list[str], list[list[Any]]]]:
        """Every table's columns and rows; raises when the file is missing, linked or not a database."""
        path = state.path(db)
        for suffix in _SIDE_FILES:
            state.path(db + suffix)  # SQLite would open these too; refuse them if they are links
        if not path.is_file():
            raise FileNotFoundError(db)
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
        try:
            objects = conn.execute(
                "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
            ).fetchall()
            tables: dict[str, tuple[list[str], list[list[Any]]]] = {}
            for kind, name in objects:
                if kind != "table" or name not in names:
                    tables[f"{kind}:{name}"] = ([], [])  # an object the task never had: the state differs
                    continue
                quoted = name.replace('"', '""')
                columns = [str(row[1]) for row in conn.execute(f'PRAGMA table_info("{quoted}")')]
                count = int(conn.execute(f'SELECT count(*) FROM "{quoted}"').fetchone()[0])
                if count > self.max_rows:
                    raise sqlite3.DatabaseError(f"table {name} has {count} rows")
                rows = [[_value(v) for v in row] for row in conn.execute(f'SELECT * FROM "{quoted}"')]
                tables[name] = (columns, rows)
            return tables
        finally:
            conn.close()


def _targets_hold(tables: dict[str, tuple[list[str], list[list[Any]]]], reference: dict[str, Any]) -> bool:
    """The rows the task asked for are there, and the rows it asked to remove are gone."""
    for key, wanted in (("present", True), ("absent", False)):
        for table, rows in (reference.get(key) or {}).items():
            have = {canonical_json(r) for r in tables.get(table, ([], []))[1]}
            if any((canonical_json(r) in have) != wanted for r in rows):
                return False
    return True
