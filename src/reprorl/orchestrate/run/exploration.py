"""Tool-level exploration: the tools the oracle needs, how often the policy runs each, and the alarm
when a needed tool goes unused.

A policy can learn to stop calling a tool it needs (or never find it) while its reward still moves;
then no later step can teach the tasks that need it. The watch runs each env family's oracle once
over the run's train tasks (real sandboxes, full permissions, whatever the run's own) and takes the
tools its successful demonstrations ran as that family's needed tools (on a seeded sample of at
most 64 tasks a family; an oracle that fails leaves the run without the watch, and says so). After
each step it logs `exploration/<family>/<tool>`, the calls to each needed tool that ran in that
step's rollouts (a call refused as unknown, unparsable or not permitted did not run), for the
families the step drew; when a needed tool has not run for `learning.tool_alarm_steps` steps that
drew its family, it writes one `tool_unexplored` event, and another only after the tool has run
again and gone quiet again.

A resumed run rebuilds the streaks from its metric lines, so it raises the alarms an unbroken run
would and no other.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reprorl.hashing import derive_seed
from reprorl.policy.chat import ChatRenderer
from reprorl.rollout.demos import collect_demonstrations
from reprorl.rollout.families import families_named
from reprorl.store import RunRecord
from reprorl.types import Task, ToolOutcome, Trajectory

ALARM_EVENT = "tool_unexplored"
ORACLE_TASKS = 64  # the oracle runs on at most this many train tasks of each family (a seeded sample)
ORACLE_EVENT = "oracle_tools"
PREFIX = "exploration"
# A call whose result came from the tool itself: it ran, whatever it returned.
RAN = frozenset(
    {ToolOutcome.OK, ToolOutcome.OUTPUT_TRUNCATED, ToolOutcome.TOOL_EXCEPTION, ToolOutcome.TOOL_TIMEOUT}
)


def ran_calls(trajectory: Trajectory) -> Counter[str]:
    """The calls of each tool that ran in one episode."""
    return Counter(r.name for turn in trajectory.turns for r in turn.tool_results if r.outcome in RAN)


def oracle_tools(demos: Iterable[Trajectory], family_of: Mapping[str, str]) -> dict[str, list[str]]:
    """Each family's tools that ran in a successful oracle demonstration, sorted."""
    needed: dict[str, set[str]] = defaultdict(set)
    for demo in demos:
        if demo.reward is not None and demo.reward.success and demo.task_id in family_of:
            needed[family_of[demo.task_id]].update(ran_calls(demo))
    return {family: sorted(tools) for family, tools in sorted(needed.items()) if tools}


async def find_needed_tools(
    record: RunRecord, tasks: Sequence[Task], renderer: ChatRenderer, seed: int
) -> dict[str, list[str]]:
    """The run's needed tools: from its record when an earlier attempt found them, else from the oracle."""
    for event in reversed(record.events().records):
        if event.get("event") == ORACLE_EVENT:
            return {str(k): [str(t) for t in v] for k, v in event["needed"].items()}
    by_family: dict[str, list[Task]] = defaultdict(list)
    for task in tasks:
        by_family[task.family].append(task)
    rng = random.Random(derive_seed(seed, "oracle-tools"))
    shown = [
        t for _, group in sorted(by_family.items()) for t in rng.sample(group, min(len(group), ORACLE_TASKS))
    ]
    try:
        demos = await collect_demonstrations(
            shown,
            renderer,
            run_id=f"{record.run_id}/oracle-tools",
            seed=derive_seed(seed, "oracle-tools"),
            families=families_named(by_family),
        )
    except Exception as exc:  # a family's oracle that fails costs the watch, never the run
        record.event(ORACLE_EVENT, needed={}, error=f"{type(exc).__name__}: {exc}"[:500])
        return {}
    needed = oracle_tools(demos, {t.id: t.family for t in shown})
    solved = sum(1 for d in demos if d.reward is not None and d.reward.success)
    record.event(ORACLE_EVENT, needed=needed, demonstrations=len(demos), solved=solved)
    return needed


@dataclass
class ExplorationWatch:
    """Per-step calls of each needed tool, and the alarm streaks (see the module docstring)."""

    needed: dict[str, list[str]]
    alarm_steps: int  # 0: figures only, no alarm
    quiet: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    fired: set[tuple[str, str]] = field(default_factory=set)

    def metrics(self, trajectories: Sequence[Trajectory], family_of: Mapping[str, str]) -> dict[str, float]:
        """`exploration/<family>/<tool>`: the step's calls that ran, for each family the step drew."""
        drawn = {family_of[t.task_id] for t in trajectories if t.task_id in family_of}
        calls: dict[str, Counter[str]] = {family: Counter() for family in drawn}
        for t in trajectories:
            if t.task_id in family_of:
                calls[family_of[t.task_id]].update(ran_calls(t))
        return {
            f"{PREFIX}/{family}/{tool}": float(calls[family][tool])
            for family in sorted(drawn)
            for tool in self.needed.get(family, [])
        }

    def observe(self, step: int, metrics: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Take one step's metric line; the alarms it raises (each an event's fields)."""
        alarms = []
        for family, tools in sorted(self.needed.items()):
            for tool in tools:
                value = metrics.get(f"{PREFIX}/{family}/{tool}")
                if value is None:  # the step drew no task of this family
                    continue
                key = (family, tool)
                if value > 0:
                    self.quiet.pop(key, None)
                    self.fired.discard(key)
                    continue
                streak = self.quiet.setdefault(key, [])
                streak.append(step)
                if self.alarm_steps and len(streak) >= self.alarm_steps and key not in self.fired:
                    self.fired.add(key)
                    alarms.append({"family": family, "tool": tool, "steps": list(streak)})
        return alarms

    def replay(self, lines: Iterable[Mapping[str, Any]], before: int) -> None:
        """Rebuild the streaks from a run's training metric lines of steps before `before`."""
        for line in lines:
            if line.get("stage") is None and isinstance(line.get("step"), int) and line["step"] < before:
                self.observe(line["step"], line)


async def open_watch(
    record: RunRecord,
    tasks: Sequence[Task],
    renderer: ChatRenderer,
    *,
    seed: int,
    alarm_steps: int,
    start: int,
) -> ExplorationWatch:
    """The run's watch, its streaks rebuilt from the metric lines of the steps before `start`; with
    `alarm_steps` 0 the watch is off (no oracle pass, no figures)."""
    if alarm_steps == 0:
        return ExplorationWatch({}, 0)
    watch = ExplorationWatch(await find_needed_tools(record, tasks, renderer, seed), alarm_steps)
    watch.replay(record.metrics().records, before=start)
    return watch
