"""Rollout filters: the quick filters of the rollout table as one SQL condition, values checked first.

Every quick filter takes a value from a closed set (a split, a termination, a failure class) or a
number, or is quoted as a SQL literal, so only the user's own WHERE text is free SQL, and that goes
through the rollout store's locked-down connection exactly as `reprorl runs rollouts --where` does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from reprorl.dashboard.security import refuse
from reprorl.types import ScoreFailure, Split, Task, Termination, ToolOutcome

SPLITS = tuple(s.value for s in Split)
TERMINATIONS = tuple(t.value for t in Termination)
TOOL_FAILURES = tuple(o.value for o in ToolOutcome if o is not ToolOutcome.OK)
SCORE_FAILURES = tuple(f.value for f in ScoreFailure)
FAILURES = (*TOOL_FAILURES, *SCORE_FAILURES)
MAX_PER_PAGE = 500
MAX_PAGE = 1_000_000


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True)
class RolloutFilters:
    """What the rollout table shows: quick filters, the user's own condition, and the page."""

    where: str = ""
    split: str = ""
    step: int | None = None
    termination: str = ""
    failure: str = ""
    reward_min: float | None = None
    reward_max: float | None = None
    family: str = ""
    task: str = ""
    page: int = 1
    per_page: int = 50

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("split", self.split, SPLITS),
            ("termination", self.termination, TERMINATIONS),
            ("failure", self.failure, FAILURES),
        ):
            if value and value not in allowed:
                raise refuse(name, f"{value[:60]!r} is not one of {', '.join(allowed)}")
        for name, bound in (("reward_min", self.reward_min), ("reward_max", self.reward_max)):
            if bound is not None and not math.isfinite(bound):
                raise refuse(name, "must be a finite number")
        if self.step is not None and self.step < 0:
            raise refuse("step", "must be >= 0")
        if not 1 <= self.page <= MAX_PAGE:
            raise refuse("page", f"must be between 1 and {MAX_PAGE:,}")
        if not 1 <= self.per_page <= MAX_PER_PAGE:
            raise refuse("per_page", f"must be between 1 and {MAX_PER_PAGE}")

    def condition(self, tasks: Mapping[str, Task]) -> str | None:
        """One SQL condition for the rollout store; None when nothing is filtered."""
        parts = []
        if self.where.strip():
            parts.append(f"({self.where.strip()})")
        if self.split:
            parts.append(f"split = {literal(self.split)}")
        if self.step is not None:
            parts.append(f"step = {int(self.step)}")
        if self.termination:
            parts.append(f"termination = {literal(self.termination)}")
        if self.failure in TOOL_FAILURES:
            parts.append(f"list_contains(tool_outcomes, {literal(self.failure)})")
        elif self.failure:
            parts.append(f"json_extract_string(record, '$.score_failure') = {literal(self.failure)}")
        if self.reward_min is not None:
            parts.append(f"reward_total >= {float(self.reward_min)!r}")
        if self.reward_max is not None:
            parts.append(f"reward_total <= {float(self.reward_max)!r}")
        if self.family:
            hashes = sorted(h for h, t in tasks.items() if t.family == self.family)
            parts.append(f"task_hash IN ({', '.join(literal(h) for h in hashes)})" if hashes else "FALSE")
        if self.task:
            parts.append(f"task_id = {literal(self.task)}")
        return " AND ".join(parts) or None

    def query(self, **changes: object) -> str:
        """This filter as a URL query (with `changes`), for links to other pages of the table."""
        from urllib.parse import urlencode

        values: dict[str, object] = {**self.__dict__, **changes}
        kept = {k: v for k, v in values.items() if v not in ("", None) and not (k == "per_page" and v == 50)}
        return urlencode(kept)
