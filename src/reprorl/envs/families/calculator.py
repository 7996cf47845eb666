"""The calculator family: multi-step arithmetic word problems that need the `calc` tool.

The numbers are large enough that answering from memory almost never works, so a policy that
skips the tool scores about zero, and one that writes the right expression scores one.
"""

from __future__ import annotations

import ast
import operator
import random
from collections.abc import Callable, Sequence
from typing import Any

from reprorl.actions import render_call
from reprorl.envs.base import ToolEnv
from reprorl.envs.common import ask_human, generate_splits, last_tool_output
from reprorl.envs.errors import InvalidArguments
from reprorl.envs.tool import tool
from reprorl.types import Message, Permission, Role, Split, Task, TaskSet

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_ABS = 10**30

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def evaluate(expression: str) -> int | float:
    """Evaluate arithmetic on numbers only; no names, calls or attributes can reach Python."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise InvalidArguments(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.replace("^", "**").replace("\u00d7", "*"), mode="eval")
    except SyntaxError as exc:
        raise InvalidArguments(f"not an arithmetic expression: {exc.msg}") from None

    def walk(node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        constant = node.value if isinstance(node, ast.Constant) else None
        if isinstance(constant, int | float) and not isinstance(constant, bool):
            return constant
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise InvalidArguments(f"exponent {right} is larger than {MAX_EXPONENT}")
            try:
                value = _BINARY[type(node.op)](left, right)
            except ZeroDivisionError:
                raise InvalidArguments("division by zero") from None
            if isinstance(value, complex) or abs(value) > MAX_ABS:
                raise InvalidArguments("result is out of range")
            return value  # type: ignore[no-any-return]
        raise InvalidArguments(f"unsupported element: {type(node).__name__}")

    return walk(tree)


def format_number(value: float) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(round(value, 6)) if isinstance(value, float) else str(value)


@tool(
    Permission.READ, params={"expression": "Arithmetic, e.g. '(37 * 24) - 58'. Operators: + - * / // % **."}
)
def calc(ctx: Any, expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the number."""
    return format_number(evaluate(expression))


class CalculatorEnv(ToolEnv):
    family = "calculator"
    tools = (calc, ask_human)
    system_prompt = (
        "Solve the problem. Use the calc tool for every computation by writing "
        '<tool_call>{"name": "calc", "arguments": {"expression": "..."}}</tool_call>. '
        "When you know the result, reply with the final number only."
    )


_STORIES: tuple[tuple[str, str, int], ...] = (
    ("A warehouse holds {a} crates of {b} bottles. It ships {c} bottles.", "{a} * {b} - {c}", 1),
    ("A school orders {a} boxes of {b} pencils and {c} loose pencils.", "{a} * {b} + {c}", 1),
    (
        "A farm packs {a} kg of apples into bags of {b} kg; then {c} more full bags arrive.",
        "{a} // {b} + {c}",
        2,
    ),
    ("A library had {a} books, lent out {b}, received {c} boxes of {d} books.", "{a} - {b} + {c} * {d}", 2),
    (
        "{a} workers each make {b} parts a day for {c} days; {d} parts fail inspection.",
        "{a} * {b} * {c} - {d}",
        3,
    ),
    (
        "A tank holds {a} litres, loses {b} litres a day for {c} days, then is topped up by {d}.",
        "{a} - {b} * {c} + {d}",
        3,
    ),
)


def _make(rng: random.Random, split: Split, index: int) -> Task:
    story, formula, difficulty = rng.choice(_STORIES)
    values = {k: rng.randint(12, 97) for k in "abcd"}
    values["a"] = rng.randint(120, 980)
    expression = formula.format(**values)
    answer = evaluate(expression)
    question = story.format(**values) + " How many are there now? Answer with a number."
    return Task(
        id=f"calc-{index}",
        family="calculator",
        prompt=(Message(role=Role.USER, content=question),),
        tools=("calc", "ask_human"),
        reference={"answer": answer, "expression": expression},
        difficulty=difficulty,
        reference_steps=1,
    )


def generate(seed: int, *, train: int = 64, eval: int = 32, holdout: int = 32) -> dict[Split, TaskSet]:
    """Deterministic train / eval / holdout task sets for the calculator family."""
    return generate_splits(
        "calculator", seed, {Split.TRAIN: train, Split.EVAL: eval, Split.HOLDOUT: holdout}, _make
    )


def oracle(task: Task, messages: Sequence[Message]) -> str:
    """Call `calc` on the reference expression once, then answer with what it returned."""
    result = last_tool_output(messages)
    if result is None:
        assert isinstance(task.reference, dict)
        return render_call("calc", {"expression": str(task.reference["expression"])})
    return result
