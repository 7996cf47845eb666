"""The pipeline's timing: live (what happens first, happens first), or recorded (a run's schedule, followed).

Two settings let timing decide part of a run: the ready lockstep (which turns share a sampling
batch) and the arrival source (which version samples each group, which step trains it). The
record holds every such decision: each turn its batch, each step its groups (`batch_assembled`).
`read_schedule` collects them into a `RecordedTiming`; a rerun given it (`train_run(..., timing=...)`)
hands it once to both sides of the pipeline: the rollout side samples every turn in its recorded
batch (`reprorl.rollout.recorded_batches`), and the source starts every group from its recorded
version and trains every step on its recorded groups (`ArrivalQueue(decided=...)`), so on the CPU it
gives back
the original bit for bit. `reprorl reproduce` does this for such runs.

A schedule that cannot be followed says why (`ScheduleError`): a run that was resumed (its
resampled groups' turns were batched twice), a turn with no recorded batch (a remote sampler).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from reprorl.config import RunSpec
from reprorl.orchestrate.pipeline.arrival import ArrivalQueue, Schedule
from reprorl.rollout.recorded_batches import ScheduleError, TurnSchedule, turn_schedule
from reprorl.rollout.runner import Barrier, ReadyBarrier
from reprorl.store import RunRecord
from reprorl.store.rollout_query import RolloutStore

__all__ = [
    "LiveTiming",
    "RecordedSchedule",
    "RecordedTiming",
    "ScheduleError",
    "Timing",
    "read_schedule",
]


@dataclass
class RecordedSchedule:
    """What timing decided in a recorded run: turn batches, and each group's version and step."""

    turns: TurnSchedule | None  # None unless the run used the arrival lockstep
    versions: dict[int, int] = field(default_factory=dict)  # arrival order: group -> its version
    steps: dict[int, tuple[int, ...]] = field(default_factory=dict)  # step -> groups, as trained

    def summary(self) -> str:
        parts = []
        if self.turns is not None:
            parts.append(f"{self.turns.followed} sampling batches as recorded")
        if self.steps:
            groups, steps = len(self.versions), len(self.steps)
            parts.append(f"{groups} groups from their recorded versions into {steps} steps")
        return ", ".join(parts)

    @property
    def diverged(self) -> str | None:
        return self.turns.diverged if self.turns is not None else None


def read_schedule(record: RunRecord, spec: RunSpec) -> RecordedSchedule:
    """The timing-dependent decisions of `record` (a run of `spec`); `ScheduleError` if they cannot
    be followed."""
    events = record.events().records
    if any(e.get("event") == "resumed" for e in events):
        raise ScheduleError("the run was resumed, and groups sampled again after it were batched twice")
    schedule = RecordedSchedule(turns=None)
    if spec.learning.pipeline.source == "arrival":
        for e in events:
            if e.get("event") == "batch_assembled":
                schedule.steps[int(e["step"])] = tuple(int(g["group"]) for g in e["groups"])
                schedule.versions.update({int(g["group"]): int(g["version"]) for g in e["groups"]})
    if spec.learning.pipeline.lockstep == "ready":
        schedule.turns = turn_schedule(RolloutStore(record).trajectories(), record.run_id)
    return schedule


class Timing(Protocol):
    """What decides the timing-dependent choices of a run, for the rollout side and the source alike."""

    def barrier(self, run_id: str) -> Barrier | None:
        """Which turns share a sampling batch; None: as `learning.pipeline.lockstep` says."""
        ...

    def arrival_queue(self, schedule: Schedule) -> ArrivalQueue:
        """The queue an arrival source assembles its batches with."""
        ...


class LiveTiming:
    """Timing decides as it goes (and the record keeps what it decided)."""

    name = "live"

    def barrier(self, run_id: str) -> Barrier | None:
        return None

    def arrival_queue(self, schedule: Schedule) -> ArrivalQueue:
        return ArrivalQueue(schedule)


@dataclass
class RecordedTiming:
    """A recorded run's decisions, made again the same way."""

    schedule: RecordedSchedule
    name = "recorded"

    def barrier(self, run_id: str) -> Barrier | None:
        turns = self.schedule.turns
        return ReadyBarrier(follow=turns, run_id=run_id) if turns is not None else None

    def arrival_queue(self, schedule: Schedule) -> ArrivalQueue:
        return ArrivalQueue(schedule, decided=self.schedule)
