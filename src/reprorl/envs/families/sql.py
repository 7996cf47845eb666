"""The SQL family: questions about a shop's SQLite database and changes to make in it, done through tools.

Every task gets its own seeded shop, built in the sandbox from `Task.setup` by `build_state`. The
agent reads with `sql_query` and writes with `sql_execute`, one guarded statement per call; the
verifier (`rewards.verifiers.sql.SqliteState`) judges the database file the episode leaves behind.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from reprorl.envs.base import ToolEnv
from reprorl.envs.common import ask_human, generate_splits, last_tool_output, solution_step
from reprorl.envs.families.sql_data import DB_NAME, Shop, digests, generate_shop
from reprorl.envs.families.sql_tasks import KINDS
from reprorl.envs.families.sql_tools import build_state, describe_table, list_tables, sql_execute, sql_query
from reprorl.types import Message, Role, Split, Task, TaskSet

FAMILY = "sql"
MAX_DRAWS = 100
SETUP_TIMEOUT_S = 30.0


class SqlEnv(ToolEnv):
    family = FAMILY
    tools = (sql_query, sql_execute, list_tables, describe_table, ask_human)
    system_prompt = (
        "You work on a shop's SQLite database (tables products, customers, orders, order_items) through"
        " tools. Call one by writing"
        ' <tool_call>{"name": "sql_query", "arguments": {"sql": "SELECT ..."}}</tool_call>.'
        " sql_query reads; sql_execute runs one INSERT, UPDATE or DELETE per call, and UPDATE and DELETE need"
        " a WHERE clause. Change only what the task asks. When you are done, reply without a tool call;"
        " to a question, reply with just the answer."
    )

    setup_fn = staticmethod(build_state)
    setup_timeout_s = SETUP_TIMEOUT_S


TOOL_NAMES = tuple(t.name for t in SqlEnv.tools)


def _make(rng: random.Random, split: Split, index: int) -> Task:
    kind = rng.choice(KINDS)  # kinds are equally likely; a shop that does not fit the kind is redrawn
    for _ in range(MAX_DRAWS):
        rows = generate_shop(rng)
        draft = kind(rng, Shop(rows))
        if draft is not None:
            break
    else:
        raise RuntimeError(f"{kind.__name__}: no fitting shop in {MAX_DRAWS} draws")
    is_answer = draft.final is None
    suffix = "" if is_answer else " When you are done, reply with a one-line summary."
    reference: dict[str, Any] = {
        "kind": "answer" if is_answer else "change",
        "db": DB_NAME,
        "tables": digests(draft.final or rows),
        "present": draft.present,
        "absent": draft.absent,
        "answer": draft.answer,
        "distractors": list(draft.distractors),
        "solution": [{"tool": tool, "arguments": {"sql": sql}} for tool, sql in draft.calls],
    }
    return Task(
        id=f"{FAMILY}-{index}",
        family=FAMILY,
        prompt=(Message(role=Role.USER, content=draft.text + suffix),),
        tools=TOOL_NAMES,
        setup={"tables": rows},
        reference=reference,
        difficulty=draft.difficulty,
        reference_steps=len(draft.calls),
        tags=(draft.kind, "answer" if is_answer else "change"),
    )


def generate(seed: int, *, train: int = 64, eval: int = 32, holdout: int = 32) -> dict[Split, TaskSet]:
    """Deterministic train / eval / holdout task sets for the SQL family."""
    return generate_splits(
        FAMILY, seed, {Split.TRAIN: train, Split.EVAL: eval, Split.HOLDOUT: holdout}, _make
    )


def first_cell(table: str) -> str:
    """The first value of the first row of a `sql_query` result table."""
    lines = table.splitlines()
    return lines[1].split(" | ")[0] if len(lines) > 2 else ""


def oracle(task: Task, messages: Sequence[Message]) -> str:
    """Make the reference solution's calls one per turn, then answer from the last result."""
    assert isinstance(task.reference, dict)
    call = solution_step(task, messages)
    if call is not None:
        return call
    if task.reference["kind"] == "answer":
        return first_cell(last_tool_output(messages) or "")
    return "Done."
