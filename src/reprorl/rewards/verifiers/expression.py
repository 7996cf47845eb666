"""Expression answers: a second verifier of arithmetic tasks that recomputes the answer from the expression.

It shares nothing with `NumericAnswer` or the env's `calc`: its own evaluator works out
`reference["expression"]`, its own reading of the answer requires that number to be stated as the
answer — the answer's only number, or its last one when it follows `=`, `:` or `is` (thousands
separators read as such, so "1,234" is one number). On honest answers the two agree; on a sloppy
one ("3941 or 3944", a list of guesses) they can disagree, and that disagreement is the signal.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from reprorl.rewards.base import FinalState, Verifier
from reprorl.rewards.registered import register_verifier
from reprorl.types import Task

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
# A run of digits grouped in threes by commas is one number; any other digits are one number each.
NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\d)")
# What may stand right before the stated answer when the text holds other numbers too.
STATED = re.compile(r"(?:=|:|\bis)\s*$", re.IGNORECASE)

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def arithmetic(expression: str) -> float:
    """The value of an expression of numbers and + - * / // % ** (and ^), nothing else."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tree = ast.parse(expression.replace("^", "**").replace("\u00d7", "*"), mode="eval")

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            if isinstance(node.value, bool):
                raise ValueError("not a number: a boolean")
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
            value = _BINARY[type(node.op)](left, right)
            if isinstance(value, complex) or not math.isfinite(value):
                raise ValueError("the expression has no real, finite value")
            return value
        raise ValueError(f"unsupported element: {type(node).__name__}")

    return walk(tree)


def numbers(text: str) -> list[tuple[float, int]]:
    """Every number in `text` with where it starts; "1,234" is one number, "1,2" two."""
    return [(float(m.group().replace(",", "")), m.start()) for m in NUMBER.finditer(text)]


def stated_number(text: str) -> float | None:
    """The number the text gives as its answer: its only number, or its last one after `=`, `:` or `is`."""
    found = numbers(text)
    if len(found) == 1:
        return found[0][0]
    if found and STATED.search(text[: found[-1][1]]):
        return found[-1][0]
    return None


@register_verifier("expression")
@dataclass(frozen=True)
class ExpressionAnswer(Verifier):
    """1.0 when the answer states exactly the value of `reference['expression']`, else 0.0."""

    abs_tol: float = 1e-6
    """Answers copied from a tool that prints six decimals are exact to this much."""

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        assert isinstance(task.reference, dict), "arithmetic tasks carry {'expression': str}"
        expected = arithmetic(str(task.reference["expression"]))
        given = stated_number(state.answer or "")
        correct = given is not None and abs(given - expected) <= self.abs_tol
        return {self.name: 1.0 if correct else 0.0}
