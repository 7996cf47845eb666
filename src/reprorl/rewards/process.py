"""Process rewards: per-step scores computed from a trajectory's recorded turns.

They need no environment, so they can score stored trajectories; the defaults reward calls
the model formed correctly and penalise reaching for tools it may not use.
"""

from __future__ import annotations

from collections.abc import Sequence

from reprorl.types import ToolOutcome, Turn

_MALFORMED = frozenset({ToolOutcome.PARSE_ERROR, ToolOutcome.UNKNOWN_TOOL, ToolOutcome.BAD_ARGUMENTS})


def step_scores(turns: Sequence[Turn]) -> tuple[float, ...]:
    """One score per turn: the share of its tool calls that were well-formed and permitted."""
    scores = []
    for turn in turns:
        results = turn.tool_results
        if not results:
            scores.append(1.0)
            continue
        good = sum(
            1 for r in results if r.outcome not in _MALFORMED and r.outcome != ToolOutcome.PERMISSION_DENIED
        )
        scores.append(good / len(results))
    return tuple(scores)


def process_components(turns: Sequence[Turn]) -> dict[str, float]:
    """`valid_calls`: share of well-formed calls; `permission_respected`: 1 unless a call was denied."""
    outcomes = [r.outcome for turn in turns for r in turn.tool_results]
    valid = sum(1 for o in outcomes if o not in _MALFORMED)
    return {
        "valid_calls": valid / len(outcomes) if outcomes else 1.0,
        "permission_respected": 0.0 if ToolOutcome.PERMISSION_DENIED in outcomes else 1.0,
    }
