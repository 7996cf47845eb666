"""Process rewards: per-step scores computed from a trajectory's recorded turns.

They need no environment, so they can score stored trajectories; the defaults reward calls
the model formed correctly and penalise reaching for tools it may not use.
"""

from __future__ import annotations

from collections.abc import Sequence

from reprorl.types import ToolOutcome, Turn

_MALFORMED = frozenset({ToolOutcome.PARSE_ERROR, ToolOutcome.UNKNOWN_TOOL, ToolOutcome.BAD_ARGUMENTS})
# Calls the agent got wrong: malformed, not allowed, or raised or ran too long on what it sent. A
# sandbox or infrastructure failure is not the agent's, and a truncated output is not a failure.
AGENT_FAILED = _MALFORMED | {
    ToolOutcome.PERMISSION_DENIED,
    ToolOutcome.TOOL_EXCEPTION,
    ToolOutcome.TOOL_TIMEOUT,
}


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
    """`valid_calls`: share of well-formed calls; `permission_respected`: 1 unless a call was denied;
    `failed_calls`: how many calls the agent got wrong (a count, to weigh below 0: a share could be
    diluted with easy calls, a count cannot, and an episode with no call owes nothing)."""
    outcomes = [r.outcome for turn in turns for r in turn.tool_results]
    valid = sum(1 for o in outcomes if o not in _MALFORMED)
    return {
        "valid_calls": valid / len(outcomes) if outcomes else 1.0,
        "permission_respected": 0.0 if ToolOutcome.PERMISSION_DENIED in outcomes else 1.0,
        "failed_calls": float(sum(1 for o in outcomes if o in AGENT_FAILED)),
    }
