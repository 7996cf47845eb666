"""The SQL family: guarded tools, deterministic splits, a verifier that reads only the final database."""

from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from reprorl.actions import parse_action
from reprorl.envs.calls import classify_call
from reprorl.envs.errors import InvalidArguments, OutsideSandbox, UnsafeAction
from reprorl.envs.families import sql_tools
from reprorl.envs.families.sql import SqlEnv, generate, oracle
from reprorl.envs.families.sql_data import DB_NAME, generate_shop
from reprorl.envs.families.sql_guard import QueryTooExpensive, statement_fault
from reprorl.envs.families.sql_tools import (
    MAX_ROWS_SHOWN,
    build_state,
    describe_table,
    list_tables,
    sql_execute,
    sql_query,
)
from reprorl.envs.sandbox import CallResult
from reprorl.hashing import canonical_json
from reprorl.rewards import FinalState
from reprorl.rewards.verifiers.sql import SqliteState
from reprorl.rollout.families import FAMILIES
from reprorl.types import Message, Role, Split, Task, Termination, ToolOutcome

TOOLS = {t.name: t for t in (sql_query, sql_execute, list_tables, describe_table)}
VERIFIER = SqliteState()


def _ctx(root: Path) -> SimpleNamespace:
    return SimpleNamespace(root=root)


@pytest.fixture
def ctx(tmp_path: Path) -> SimpleNamespace:
    context = _ctx(tmp_path)
    build_state(context, {"tables": generate_shop(random.Random(7))})
    return context


def _dump(root: Path) -> list[Any]:
    with sqlite3.connect(root / DB_NAME) as conn:
        return [conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in ("products", "orders")]


@pytest.fixture(scope="module")
def eval_tasks() -> tuple[Task, ...]:
    return generate(0)[Split.EVAL].tasks


# -- tools -----------------------------------------------------------------------------------------


def test_query_returns_a_compact_table(ctx: SimpleNamespace) -> None:
    out = sql_query(ctx, sql="SELECT id, name FROM products WHERE id <= 2 ORDER BY id")
    lines = out.splitlines()
    assert lines[0] == "id | name"
    assert lines[1].startswith("1 | ") and lines[-1] == "(2 rows)"
    assert sql_query(ctx, sql="SELECT 'a;b -- DROP TABLE x' AS s;").splitlines()[1] == "a;b -- DROP TABLE x"
    assert "cid | name" in sql_query(ctx, sql="PRAGMA table_info(products)")


def test_list_and_describe(ctx: SimpleNamespace) -> None:
    tables = list_tables(ctx).splitlines()
    assert [t.split()[0] for t in tables] == ["customers", "order_items", "orders", "products"]
    described = describe_table(ctx, name="orders")
    assert described.startswith("CREATE TABLE orders") and "status IN ('pending'" in described
    with pytest.raises(InvalidArguments, match="no table"):
        describe_table(ctx, name="nope")


def test_execute_commits_and_counts(ctx: SimpleNamespace) -> None:
    assert sql_execute(ctx, sql="UPDATE products SET stock = 99 WHERE id IN (1, 2)") == "2 rows affected."
    assert sql_query(ctx, sql="SELECT stock FROM products WHERE id = 2").splitlines()[1] == "99"
    out = sql_execute(ctx, sql="DELETE FROM order_items WHERE order_id = 1 AND qty > 0 RETURNING order_id")
    assert out.splitlines()[0].endswith("affected.") and "order_id" in out


def test_execute_failures_roll_back(ctx: SimpleNamespace) -> None:
    before = _dump(ctx.root)
    with pytest.raises(InvalidArguments, match="CHECK constraint"):
        sql_execute(ctx, sql="UPDATE products SET stock = -1 WHERE id = 1")  # CHECK (stock >= 0)
    with pytest.raises(InvalidArguments, match="FOREIGN KEY"):
        sql_execute(ctx, sql="INSERT INTO orders VALUES (999, 999, 'pending', '2024-01-01')")
    assert _dump(ctx.root) == before


@pytest.mark.parametrize(
    "sql",
    [
        "DROP TABLE products",
        "drop /* hidden */ table orders",
        "ALTER TABLE products ADD COLUMN x",
        "DELETE FROM orders",
        "UPDATE products SET stock = 0",
        "WITH x AS (SELECT 1 WHERE 1) DELETE FROM orders",
        "UPDATE products SET stock = (SELECT 1 WHERE 1)",
        "SELECT 1; DROP TABLE products",
        "UPDATE products SET stock = 1 WHERE id = 1; DELETE FROM orders WHERE 1",
        "ATTACH DATABASE 'other.db' AS other",
        "DETACH DATABASE main",
        "PRAGMA journal_mode = WAL",
        "PRAGMA writable_schema(1)",
        "VACUUM INTO '/tmp/copy.db'",
    ],
)
@pytest.mark.parametrize("tool_name", ["sql_query", "sql_execute"])
def test_destructive_statements_are_unsafe(ctx: SimpleNamespace, sql: str, tool_name: str) -> None:
    before = _dump(ctx.root)
    with pytest.raises(UnsafeAction):
        TOOLS[tool_name](ctx, sql=sql)
    assert _dump(ctx.root) == before
    assert sorted(p.name for p in ctx.root.iterdir()) == [DB_NAME]


@pytest.mark.parametrize(
    "sql",
    ["UPDATE products SET stock = 0 WHERE 1", "DELETE FROM order_items WHERE order_id IS NULL OR 1 = 1"],
)
def test_a_where_that_matches_every_row_is_unsafe_and_rolled_back(ctx: SimpleNamespace, sql: str) -> None:
    before = _dump(ctx.root)
    with pytest.raises(UnsafeAction, match="every row"):
        sql_execute(ctx, sql=sql)
    assert _dump(ctx.root) == before


def test_the_engine_refuses_what_the_tokenizer_lets_through(ctx: SimpleNamespace) -> None:
    before = _dump(ctx.root)
    with pytest.raises((UnsafeAction, InvalidArguments)):
        sql_execute(ctx, sql="UPDATE sqlite_master SET sql = '' WHERE name = 'orders'")
    with pytest.raises(UnsafeAction, match="load_extension"):
        sql_query(ctx, sql="SELECT load_extension('/tmp/evil.so')")
    with pytest.raises(InvalidArguments, match="nondeterministic"):
        sql_query(ctx, sql="SELECT hex(randomblob(4))")
    assert _dump(ctx.root) == before


@pytest.mark.parametrize(
    ("tool_name", "sql", "match"),
    [
        ("sql_query", "INSERT INTO customers VALUES (99, 'x', 'y', 'z')", "read-only"),
        ("sql_query", "CREATE TABLE t (a)", "not supported"),
        ("sql_query", "SELECT random()", "nondeterministic"),
        ("sql_query", "SELECT date('now')", "clock"),
        ("sql_query", "SELECT datetime()", "clock"),
        ("sql_query", "PRAGMA user_version", "not supported"),
        ("sql_query", "   -- only a comment", "no SQL"),
        ("sql_query", "SELECT 'unterminated", "unterminated"),
        ("sql_query", "SELECT " + "1, " * 2000 + "1", "longer than"),
        ("sql_execute", "SELECT * FROM products", "sql_query"),
        ("sql_execute", "BEGIN", "not supported"),
        ("sql_execute", "CREATE TABLE t (a)", "not supported"),
    ],
)
def test_nonsense_is_invalid(ctx: SimpleNamespace, tool_name: str, sql: str, match: str) -> None:
    with pytest.raises(InvalidArguments, match=match):
        TOOLS[tool_name](ctx, sql=sql)


def _classified(tool_name: str, error: Exception) -> Any:
    """How the env classifies a call whose tool raised `error` in its sandbox."""
    result = CallResult(
        ok=False,
        value="",
        error_type=type(error).__name__,
        error=str(error),
        timed_out=False,
        crashed=False,
        duration_s=0.1,
    )
    return classify_call("c0", tool_name, result, 4096)


@pytest.mark.parametrize(
    ("tool_name", "sql", "match"),
    [
        ("sql_query", "SELECT name FROM customers WHERE city = = 'Leeds'", "syntax error"),
        ("sql_query", "SELECT nickname FROM customers", "no such column"),
        ("sql_query", "SELECT * FROM clients", "no such table"),
        ("sql_execute", "INSERT INTO customers VALUES (1, 'x', 'y', 'z')", "UNIQUE constraint"),
        ("sql_execute", "UPDATE orders SET status = 'shipped' WHERE idx = 1", "no such column"),
    ],
)
def test_a_statement_the_engine_rejects_is_the_callers_mistake(
    ctx: SimpleNamespace, tool_name: str, sql: str, match: str
) -> None:
    """Syntax, names and constraints are the statement's fault: invalid arguments (the model's), with
    the engine's own message; an I/O or locking error would stay the tool's."""
    before = _dump(ctx.root)
    with pytest.raises(InvalidArguments, match=match) as caught:
        TOOLS[tool_name](ctx, sql=sql)
    assert _classified(tool_name, caught.value).result.outcome == ToolOutcome.BAD_ARGUMENTS
    assert _dump(ctx.root) == before


def test_engine_errors_are_split_by_their_result_code() -> None:
    busy = sqlite3.OperationalError("database is locked")
    busy.sqlite_errorname = "SQLITE_BUSY"  # type: ignore[attr-defined]
    io = sqlite3.OperationalError("disk I/O error")
    io.sqlite_errorname = "SQLITE_IOERR_WRITE"  # type: ignore[attr-defined]
    constraint = sqlite3.IntegrityError("NOT NULL constraint failed: orders.created")
    constraint.sqlite_errorname = "SQLITE_CONSTRAINT_NOTNULL"  # type: ignore[attr-defined]
    assert not statement_fault(busy) and not statement_fault(io)
    assert statement_fault(constraint)
    assert statement_fault(sqlite3.ProgrammingError("You can only execute one statement at a time."))
    assert not statement_fault(sqlite3.DatabaseError("file is not a database"))
    assert not statement_fault(sqlite3.ProgrammingError("Cannot operate on a closed database."))


def test_runaway_query_is_stopped_and_classified_as_a_tool_exception(ctx: SimpleNamespace) -> None:
    runaway = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    with pytest.raises(QueryTooExpensive) as caught:
        sql_query(ctx, sql=runaway)
    classified = _classified("sql_query", caught.value)
    assert classified.result.outcome == ToolOutcome.TOOL_EXCEPTION and classified.terminates is None
    flood = (
        "INSERT INTO customers SELECT 100 + x, 'n' || x, 'e', 'c'"
        " FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c)"
    )
    with pytest.raises(QueryTooExpensive):
        sql_execute(ctx, sql=flood)
    assert "customers (" in list_tables(ctx) and "100" not in sql_query(
        ctx, sql="SELECT count(*) FROM customers"
    )


def test_output_is_capped(ctx: SimpleNamespace) -> None:
    many = sql_query(
        ctx, sql="WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 200) SELECT x FROM c"
    )
    lines = many.splitlines()
    assert len(lines) == MAX_ROWS_SHOWN + 2 and lines[-1] == "(showing 30 of 200 rows; 170 left out)"
    endless = sql_query(
        ctx, sql="WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"
    )
    assert endless.splitlines()[-1] == "(showing 30 of more than 1000 rows)"
    wide = sql_query(ctx, sql="SELECT printf('%.500c', 'x') AS long")
    assert len(wide.splitlines()[1]) == 80 and wide.splitlines()[1].endswith("…")


def test_database_reached_through_a_link_out_is_refused(tmp_path: Path) -> None:
    outside, root = tmp_path / "outside", tmp_path / "work"
    outside.mkdir()
    root.mkdir()
    build_state(_ctx(outside), {"tables": generate_shop(random.Random(1))})
    (root / DB_NAME).symlink_to(outside / DB_NAME)
    with pytest.raises(OutsideSandbox):
        sql_query(_ctx(root), sql="SELECT 1")
    with pytest.raises(OutsideSandbox):
        list_tables(_ctx(root))


def test_missing_database_is_an_ordinary_failure(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        sql_query(_ctx(tmp_path), sql="SELECT 1")


# -- generation ------------------------------------------------------------------------------------


def test_generation_is_deterministic_disjoint_and_tagged() -> None:
    first, again, other = generate(3), generate(3), generate(4)
    assert {s: t.version for s, t in first.items()} == {s: t.version for s, t in again.items()}
    assert all(first[s].version != other[s].version for s in first)
    # The same question may recur about a different shop; the same problem never does.
    problems = {
        s: {(t.prompt[-1].content, canonical_json(t.setup)) for t in ts.tasks} for s, ts in first.items()
    }
    assert sum(map(len, problems.values())) == sum(len(ts.tasks) for ts in first.values())
    assert not (problems[Split.TRAIN] | problems[Split.HOLDOUT]) & problems[Split.EVAL]
    assert [len(first[s].tasks) for s in (Split.TRAIN, Split.EVAL, Split.HOLDOUT)] == [64, 32, 32]
    for split, tasks in first.items():
        for task in tasks.tasks:
            assert task.split == split and task.family == "sql" and task.difficulty in (1, 2, 3)
            assert isinstance(task.reference, dict) and task.reference["kind"] in task.tags
            assert task.reference_steps == len(task.reference["solution"])  # type: ignore[arg-type]
            assert set(task.tools) <= {t.name for t in SqlEnv.tools}
        assert ["required" in t.tags for t in tasks.tasks[:3]] == [True, True, False]
    kinds = {t.tags for ts in first.values() for t in ts.tasks}
    assert any("answer" in k for k in kinds) and any("change" in k for k in kinds)
    assert generate(3, train=100)[Split.EVAL].version == first[Split.EVAL].version


def test_family_is_registered() -> None:
    family = FAMILIES["sql"]
    assert family.env is SqlEnv and isinstance(family.verifier, SqliteState)
    modules = {t.fn_ref.split(":")[0] for t in SqlEnv.tools if not t.host}
    assert modules <= set(family.tool_modules) and sql_tools.__name__ in family.tool_modules


# -- verifier --------------------------------------------------------------------------------------


def _apply_solution(root: Path, task: Task) -> None:
    """The task's intended change made with plain sqlite3, not through the tools."""
    assert isinstance(task.reference, dict)
    with sqlite3.connect(root / DB_NAME) as conn:
        for step in task.reference["solution"]:  # type: ignore[union-attr]
            assert isinstance(step, dict) and isinstance(step["arguments"], dict)
            if step["tool"] == "sql_execute":
                conn.execute(str(step["arguments"]["sql"]))
    conn.close()


def _answer(task: Task) -> str:
    assert isinstance(task.reference, dict)
    return str(task.reference["answer"]) if task.reference["kind"] == "answer" else "Done."


def _score(task: Task, root: Path, answer: str) -> float:
    return VERIFIER.score(task, FinalState(answer, root, Termination.ANSWERED))["outcome"]


def test_verifier_on_every_eval_task(tmp_path: Path, eval_tasks: tuple[Task, ...]) -> None:
    for i, task in enumerate(eval_tasks):
        root = tmp_path / f"t{i}"
        root.mkdir()
        build_state(_ctx(root), task.setup)  # type: ignore[arg-type]
        is_change = isinstance(task.reference, dict) and task.reference["kind"] == "change"
        # (b) the state as it started: a change task is not done; a question still needs its answer.
        assert _score(task, root, "Done." if is_change else "") == 0.0
        # (a) the intended change (or the right answer) scores one.
        _apply_solution(root, task)
        assert _score(task, root, _answer(task)) == 1.0, task.tags
        # (c) the right change plus one unrelated change scores zero.
        with sqlite3.connect(root / DB_NAME) as conn:
            conn.execute("UPDATE customers SET city = 'Atlantis' WHERE id = 1")
        conn.close()
        assert _score(task, root, _answer(task)) == 0.0


def test_verifier_refuses_links_to_a_correct_database(tmp_path: Path, eval_tasks: tuple[Task, ...]) -> None:
    task = next(t for t in eval_tasks if isinstance(t.reference, dict) and t.reference["kind"] == "change")
    good, root = tmp_path / "good", tmp_path / "work"
    good.mkdir()
    root.mkdir()
    build_state(_ctx(good), task.setup)  # type: ignore[arg-type]
    _apply_solution(good, task)
    assert _score(task, good, "Done.") == 1.0
    (root / DB_NAME).symlink_to(good / DB_NAME)
    assert _score(task, root, "Done.") == 0.0
    (root / DB_NAME).unlink()
    shutil.copy(good / DB_NAME, root / DB_NAME)
    (root / (DB_NAME + "-journal")).symlink_to(good / "elsewhere")
    assert _score(task, root, "Done.") == 0.0


def test_verifier_answers_must_name_one_candidate(tmp_path: Path, eval_tasks: tuple[Task, ...]) -> None:
    task = next(t for t in eval_tasks if isinstance(t.reference, dict) and t.reference["distractors"])
    assert isinstance(task.reference, dict)
    build_state(_ctx(tmp_path), task.setup)  # type: ignore[arg-type]
    right = str(task.reference["answer"])
    everyone = ", ".join([right, *map(str, task.reference["distractors"])])  # type: ignore[arg-type]
    assert _score(task, tmp_path, f"It is {right.upper()}.") == 1.0
    assert _score(task, tmp_path, everyone) == 0.0
    (tmp_path / DB_NAME).write_bytes(b"not a database")
    assert _score(task, tmp_path, right) == 0.0


# -- the oracle, end to end without a sandbox ------------------------------------------------------


def _play(task: Task, root: Path, script: Any) -> tuple[str, int]:
    messages = list(task.prompt)
    calls = 0
    for _ in range(10):
        action = parse_action(script(task, messages))
        if action.is_final:
            return action.answer, calls
        for call in action.tool_calls:
            calls += 1
            content = TOOLS[call.name](_ctx(root), **call.arguments)
            messages.append(Message(role=Role.TOOL, content=content, tool_call_id=call.id, name=call.name))
    raise AssertionError("the script never answered")


def test_oracle_solves_every_eval_task_and_answering_at_once_never_does(
    tmp_path: Path, eval_tasks: tuple[Task, ...]
) -> None:
    for i, task in enumerate(eval_tasks):
        solved, lazy = tmp_path / f"o{i}", tmp_path / f"l{i}"
        for root in (solved, lazy):
            root.mkdir()
            build_state(_ctx(root), task.setup)  # type: ignore[arg-type]
        answer, calls = _play(task, solved, oracle)
        assert calls == task.reference_steps
        assert _score(task, solved, answer) == 1.0, task.tags
        guess, _ = _play(task, lazy, lambda t, m: "I am not sure; maybe 0.")
        assert _score(task, lazy, guess) == 0.0, task.tags
