"""In-loop screening: which train tasks still show a trainable signal, and each step's draw from them.

Seed 004's screens found that only a share of tasks teaches at any time: a group whose rewards are all
equal (every member passed, or every one failed) gives a group-relative advantage nothing, and its
rollouts are compute spent on no update. With `data.screen`, each group leaves a verdict on its task:
`signal` (its counted rewards differ), `too_easy` (equal, and every member succeeded) or `no_signal`
(equal otherwise); a group with fewer than two counted members leaves none. A task whose latest
verdict is not `signal` rests for `rest_steps` steps (by then the policy has moved), and each step
draws its tasks, and each family its quota, from those not resting, filling a shortfall with the
resting tasks due back soonest.

A step's draw reads only the verdicts of steps at least `max_staleness + 1` before it, whose updates
the policy it samples from has taken, so it is the same however sampling and training overlap; a
resumed run rebuilds the verdicts from its `task_signal` events, so it draws as an unbroken run would.
Eval suites are never touched. At the end, the tasks whose latest verdict was `signal` are registered
as a version of `<train>-signal`, its lineage naming the run and the train set it was screened from.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reprorl.config import RunSpec
from reprorl.rollout.scoring import counted
from reprorl.store import RunRecord, Store
from reprorl.types import Task, TaskSet, Trajectory

EVENT = "task_signal"
REGISTERED_EVENT = "signal_tasks_registered"
SIGNAL, TOO_EASY, NO_SIGNAL = "signal", "too_easy", "no_signal"
SUFFIX = "-signal"


def group_verdicts(trajectories: Iterable[Trajectory]) -> dict[str, str]:
    """Each drawn task's verdict from its group's counted rollouts (see the module docstring)."""
    members: dict[str, list[Trajectory]] = defaultdict(list)
    for t in counted(trajectories):
        if t.reward is not None:
            members[t.task_id].append(t)
    out: dict[str, str] = {}
    for task_id, group in sorted(members.items()):
        if len(group) < 2:
            continue
        rewards = {t.reward.total for t in group if t.reward is not None}
        if len(rewards) > 1:
            out[task_id] = SIGNAL
        elif all(t.reward is not None and t.reward.success for t in group):
            out[task_id] = TOO_EASY
        else:
            out[task_id] = NO_SIGNAL
    return out


@dataclass
class SignalPool:
    """The verdicts so far, by step, and which tasks rest at a given step."""

    rest_steps: int
    lag: int  # learning.pipeline.max_staleness: a step reads verdicts of steps before step - lag
    verdicts: dict[int, dict[str, str]] = field(default_factory=dict)

    def observe(self, step: int, verdicts: Mapping[str, str]) -> None:
        self.verdicts[step] = dict(verdicts)

    def latest(self, before: int) -> dict[str, tuple[int, str]]:
        """Each task's latest verdict from the steps before `before`, with its step."""
        out: dict[str, tuple[int, str]] = {}
        for step in sorted(s for s in self.verdicts if s < before):
            out.update({task: (step, verdict) for task, verdict in self.verdicts[step].items()})
        return out

    def resting(self, step: int) -> dict[str, int]:
        """Tasks that sit out step `step`, each with the step it may be drawn again."""
        back = {
            task: seen + self.rest_steps
            for task, (seen, verdict) in self.latest(step - self.lag).items()
            if verdict != SIGNAL
        }
        return {task: due for task, due in back.items() if due > step}

    def replay(self, events: Iterable[Mapping[str, Any]], before: int) -> None:
        """Rebuild the verdicts of steps before `before` from a run's `task_signal` events (the last
        one of a step wins: a step run again after a resume writes its verdicts again)."""
        for event in events:
            step = event.get("step")
            if event.get("event") == EVENT and isinstance(step, int) and step < before:
                self.observe(step, {str(k): str(v) for k, v in event["verdicts"].items()})


def open_pool(spec: RunSpec, record: RunRecord, start: int) -> SignalPool | None:
    """The run's pool with its verdicts of the steps before `start`; None without `data.screen`."""
    screen = spec.data.screen
    if screen is None:
        return None
    pool = SignalPool(screen.rest_steps, spec.learning.pipeline.max_staleness)
    pool.replay(record.events().records, before=start)
    return pool


def register_signal_tasks(
    store: Store, spec: RunSpec, record: RunRecord, pool: SignalPool, tasks: Sequence[Task]
) -> str | None:
    """The tasks whose latest verdict was `signal`, as a version of `<train>-signal` with its lineage;
    None when no task showed signal."""
    latest = pool.latest(max(pool.verdicts, default=-1) + 1)
    keep = {task for task, (_, verdict) in latest.items() if verdict == SIGNAL}
    if not keep:
        record.event(REGISTERED_EVENT, artifact=None, tasks=0)
        return None
    train = store.resolve(str(spec.data.train))
    name = (train.version.name if train.version else "train") + SUFFIX
    subset = TaskSet(name=name, tasks=tuple(t for t in tasks if t.id in keep))
    meta = {
        "screened_from": train.hash,
        "screen_run": record.run_id,
        "rest_steps": pool.rest_steps,
        "last_seen": {task: latest[task][0] for task in sorted(keep)},
    }
    version = store.add_bytes(name, subset.to_jsonl(), kind="taskset", meta=meta)
    store.registry.link(version.hash, train.hash, "screened_from", run_id=record.run_id)
    record.event(REGISTERED_EVENT, artifact=version.label, tasks=len(subset.tasks))
    return version.label


def observe_step(
    pool: SignalPool, record: RunRecord, step: int, trajectories: Sequence[Trajectory]
) -> dict[str, float]:
    """Take one trained step's verdicts into the pool and the record; its `screen/` figures."""
    verdicts = group_verdicts(trajectories)
    pool.observe(step, verdicts)
    record.event(EVENT, step=step, verdicts=verdicts)
    resting = pool.resting(step)
    counts = {v: sum(1 for x in verdicts.values() if x == v) for v in (SIGNAL, TOO_EASY, NO_SIGNAL)}
    drawn = {t.task_id for t in trajectories}
    return {
        "screen/resting": float(len(resting)),
        "screen/drawn_resting": float(len(drawn & resting.keys())),
        **{f"screen/{name}": float(n) for name, n in counts.items()},
    }
