"""The built-in env families — calculator, sql, files — each paired with its verifier and oracle."""

from __future__ import annotations

from reprorl.envs.families import calculator, files, sql
from reprorl.rewards.verifiers.expression import ExpressionAnswer
from reprorl.rewards.verifiers.files import FileTreeState
from reprorl.rewards.verifiers.numeric import NumericAnswer
from reprorl.rewards.verifiers.sql import SqliteState
from reprorl.rollout.families import Family, register_family

register_family(
    Family(
        "calculator",
        calculator.CalculatorEnv,
        NumericAnswer(),
        calculator.generate,
        calculator.oracle,
        ("reprorl.envs.families.calculator",),
        cross=(ExpressionAnswer(),),
    )
)
register_family(
    Family("sql", sql.SqlEnv, SqliteState(), sql.generate, sql.oracle, ("reprorl.envs.families.sql_tools",))
)
register_family(
    Family(
        "files",
        files.FilesEnv,
        FileTreeState(),
        files.generate,
        files.oracle,
        ("reprorl.envs.families.files_tools",),
    )
)
