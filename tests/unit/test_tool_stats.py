"""Per-tool counters: outcomes by tool and class, failure rates, usage shares, human takeovers."""

from __future__ import annotations

import pytest

from reprorl.rollout import ToolStats
from reprorl.types import Split, Termination, ToolOutcome, ToolResult, Trajectory, Turn


def _trajectory(*results: tuple[str, ToolOutcome]) -> Trajectory:
    turn = Turn(index=0, tool_results=tuple(ToolResult(call_id="c", name=n, outcome=o) for n, o in results))
    return Trajectory(
        run_id="r",
        rollout_id="r/0",
        split=Split.TRAIN,
        task_id="t",
        task_hash="h",
        turns=(turn,),
        termination=Termination.ANSWERED,
    )


def test_counts_rates_usage_and_takeovers() -> None:
    stats = ToolStats().add(
        [
            _trajectory(("calc", ToolOutcome.OK), ("calc", ToolOutcome.TOOL_TIMEOUT)),
            _trajectory(
                ("calc", ToolOutcome.OK), ("ask_human", ToolOutcome.OK), ("calc", ToolOutcome.INFRA_ERROR)
            ),
        ]
    )
    assert stats.episodes == 2
    assert stats.counts[("calc", ToolOutcome.TOOL_TIMEOUT)] == 1
    assert stats.calls("calc") == 4 and stats.calls() == 5
    assert stats.failure_rate("calc") == pytest.approx(1 / 3)  # infra errors are not the agent's
    assert stats.failure_rate("calc", include_platform=True) == pytest.approx(2 / 4)
    assert stats.usage() == {"ask_human": pytest.approx(0.2), "calc": pytest.approx(0.8)}
    assert stats.human_takeovers == 1
    metrics = stats.as_metrics()
    assert metrics["tools/calc/tool_timeout"] == 1.0
    assert metrics["tools/human_takeovers"] == 1.0
    assert metrics["tools/calc/failure_rate"] == pytest.approx(1 / 3)
    assert ToolStats().failure_rate() == 0.0 and ToolStats().usage() == {}
