"""Per-tool counters over trajectories: outcomes by tool and class, usage, and human takeovers.

These are the numbers a run's health metrics and reports show: which tool fails, how, and how
often the agent reaches for each tool (exploration over time).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from reprorl.types import ToolOutcome, Trajectory

HUMAN_TOOL = "ask_human"
_PLATFORM = frozenset({ToolOutcome.SANDBOX_ERROR, ToolOutcome.INFRA_ERROR})


@dataclass
class ToolStats:
    """Counts of tool results by (tool, outcome), over any number of trajectories."""

    counts: Counter[tuple[str, ToolOutcome]] = field(default_factory=Counter)
    human_takeovers: int = 0
    episodes: int = 0

    def add(self, trajectories: Iterable[Trajectory]) -> ToolStats:
        for trajectory in trajectories:
            self.episodes += 1
            for turn in trajectory.turns:
                for result in turn.tool_results:
                    name = result.name or "<unparsed>"
                    self.counts[(name, result.outcome)] += 1
                    if name == HUMAN_TOOL and result.outcome == ToolOutcome.OK:
                        self.human_takeovers += 1
        return self

    def calls(self, tool: str | None = None) -> int:
        return sum(n for (name, _), n in self.counts.items() if tool is None or name == tool)

    def failure_rate(self, tool: str | None = None, *, include_platform: bool = False) -> float:
        """Share of calls that did not succeed; platform failures are not the agent's unless asked."""
        total = failed = 0
        for (name, outcome), n in self.counts.items():
            if tool is not None and name != tool:
                continue
            if outcome in _PLATFORM and not include_platform:
                continue
            total += n
            if outcome not in (ToolOutcome.OK, ToolOutcome.OUTPUT_TRUNCATED):
                failed += n
        return failed / total if total else 0.0

    def usage(self) -> dict[str, float]:
        """Each tool's share of all calls (the exploration profile)."""
        total = self.calls()
        per_tool: Counter[str] = Counter()
        for (name, _), n in self.counts.items():
            per_tool[name] += n
        return {name: n / total for name, n in sorted(per_tool.items())} if total else {}

    def as_metrics(self, prefix: str = "tools") -> dict[str, float]:
        """Flat metric names, e.g. `tools/calc/tool_timeout` (counts) and `tools/calc/failure_rate`."""
        metrics: dict[str, float] = {
            f"{prefix}/{n}/{o.value}": float(c) for (n, o), c in sorted(self.counts.items())
        }
        for name in sorted({n for n, _ in self.counts}):
            metrics[f"{prefix}/{name}/failure_rate"] = self.failure_rate(name)
        for name, share in self.usage().items():
            metrics[f"{prefix}/{name}/usage"] = share
        metrics[f"{prefix}/human_takeovers"] = float(self.human_takeovers)
        metrics[f"{prefix}/failure_rate"] = self.failure_rate()
        return metrics
