"""The built-in env families, each bound to its verifier, task generator and oracle.

Envs and verifiers are separate layers (a verifier must be testable without an env), so a family
is the pairing made one level up, here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from reprorl.envs.base import ToolEnv
from reprorl.envs.common import impossible_variant
from reprorl.envs.families import calculator, files, sql
from reprorl.rewards.base import Verifier
from reprorl.rewards.verifiers.expression import ExpressionAnswer
from reprorl.rewards.verifiers.files import FileTreeState
from reprorl.rewards.verifiers.numeric import NumericAnswer
from reprorl.rewards.verifiers.sql import SqliteState
from reprorl.rollout.episode import Script
from reprorl.types import Split, Task, TaskSet

Generator = Callable[..., dict[Split, TaskSet]]


@dataclass(frozen=True)
class Family:
    """Everything needed to run, score and test one kind of task."""

    name: str
    env: type[ToolEnv]
    verifier: Verifier
    generate: Generator
    oracle: Script
    tool_modules: tuple[str, ...]
    """Modules the sandbox imports so it can run the family's tools."""
    impossible: Callable[[Task], Task] = impossible_variant
    """A variant of a task that no honest episode can solve (reward audits: any reward is cheating)."""
    cross: tuple[Verifier, ...] = ()
    """Independent second verifiers of the same tasks: each scores the same final state, and where one
    disagrees with `verifier` the reward is in doubt (recorded as `cross/<class>`, never weighted)."""


FAMILIES: dict[str, Family] = {
    "calculator": Family(
        "calculator",
        calculator.CalculatorEnv,
        NumericAnswer(),
        calculator.generate,
        calculator.oracle,
        ("reprorl.envs.families.calculator",),
        cross=(ExpressionAnswer(),),
    ),
    "sql": Family(
        "sql",
        sql.SqlEnv,
        SqliteState(),
        sql.generate,
        sql.oracle,
        ("reprorl.envs.families.sql_tools",),
    ),
    "files": Family(
        "files",
        files.FilesEnv,
        FileTreeState(),
        files.generate,
        files.oracle,
        ("reprorl.envs.families.files_tools",),
    ),
}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"no env family {name!r}; families: {', '.join(sorted(FAMILIES))}") from None
