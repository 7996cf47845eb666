"""The arrival source: steps train on groups in the order they finish (`arrival.py`), checkpoints included.

Each step takes the groups the arrival queue hands it, records which groups those were
(`batch_assembled`: group id, planned step, version), and passes them on as one batch, with each
group's version so the loop logs the batch's staleness over its groups.

A checkpoint at step n holds, in `pipeline.json`, every group started and not yet trained: the
finished ones by their stored part (and its sha256), the ones still running by the version they
sample from, whose tensors it keeps (`versions/<index>.safetensors`). It also names the parts of
groups already trained that were planned for step n or later, so a resume's rewind keeps them. On
resume the finished groups are read back, a running group whose part was written after the
checkpoint is read back too (the part proves it finished), and every other one is sampled again
from its own version; nothing started is lost or trained twice, and the events say what was kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from reprorl.orchestrate.pipeline.arrival import ArrivalQueue, FinishedGroup, GroupProducer, Schedule
from reprorl.orchestrate.pipeline.batches import (
    PIPELINE_FILE,
    Batch,
    read_result,
    save_versions,
    version_tensors,
)
from reprorl.orchestrate.pipeline.executors import BatchRunner
from reprorl.orchestrate.pipeline.versions import PolicyVersions
from reprorl.orchestrate.run.checkpoint import Checkpoint
from reprorl.rollout.runner import RolloutJob, RolloutResult
from reprorl.store import RunRecord
from reprorl.store.rollouts import RolloutWriter, find_parts
from reprorl.types import Split


@dataclass(frozen=True)
class StartedGroup:
    """A group a checkpoint names as started and not yet trained; `part` is None while it runs."""

    group: int
    version: int
    policy_version: str
    part: str | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class ArrivalState:
    """What an arrival-order checkpoint holds of its queue."""

    started: tuple[StartedGroup, ...]
    trained_ahead: dict[str, int]  # part of a group trained before its planned step -> that step
    versions: dict[int, str]


def load_arrivals(folder: Path) -> ArrivalState | None:
    path = folder / PIPELINE_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if "started" not in data:
        return None  # a planned source's checkpoint
    return ArrivalState(
        tuple(StartedGroup(**g) for g in data["started"]),
        {str(p): int(step) for p, step in data["trained_ahead"].items()},
        {int(i): v for i, v in data["versions"].items()},
    )


class ArrivalSource:
    """Groups in the order they finish, each trained by its staleness deadline."""

    name = "arrival"

    def __init__(
        self,
        versions: PolicyVersions,
        writer: RolloutWriter,
        record: RunRecord,
        *,
        plan: Callable[[int], Sequence[RolloutJob]],
        group_size: int,
        schedule: Schedule,
        queue: ArrivalQueue,
    ) -> None:
        """`queue`: the schedule's queue, live or following a recorded run (`timing.py`)."""
        self.versions, self.writer, self.record, self.plan = versions, writer, record, plan
        self.group_size, self.schedule, self.queue = group_size, schedule, queue
        self.state: tuple[Path, ArrivalState] | None = None
        self.kept: dict[int, StartedGroup] = {}  # finished groups a resume reads back
        self.resampled: dict[int, int] = {}  # running groups a resume samples again, with versions
        self.first_group = 0  # the first group the producer has yet to start
        self.trained_ahead: dict[str, int] = {}  # parts of groups trained before their planned step

    def group_jobs(self, group: int) -> list[RolloutJob]:
        """Group `group`'s jobs: the (group mod B)-th group step group // B plans."""
        step, position = divmod(group, self.schedule.per_step)
        size = self.group_size
        return list(self.plan(step)[position * size : (position + 1) * size])

    @property
    def depth(self) -> int:
        return self.queue.depth

    @property
    def max_staleness(self) -> int:
        return self.schedule.max_staleness

    def produce(self, batches: BatchRunner, start: int) -> Coroutine[Any, Any, None]:
        producer = GroupProducer(batches, self.versions, self.queue, self.writer, jobs=self.group_jobs)
        return producer.run(self.first_group, dict(self.resampled))

    async def open_version(self, step: int) -> None:
        await self.queue.open_version(step)

    async def take(self, step: int) -> Batch:
        groups = await self.queue.take(step)
        self.trained_ahead = {p: s for p, s in self.trained_ahead.items() if s > step}
        for g in groups:
            if g.part is not None and self.schedule.planned_step(g.index) > step:
                self.trained_ahead[g.part] = self.schedule.planned_step(g.index)
        self.record.event(
            "batch_assembled",
            step=step,
            groups=[
                {
                    "group": g.index,
                    "group_id": self.group_jobs(g.index)[0].group_id,
                    "planned_step": self.schedule.planned_step(g.index),
                    "version": g.version,
                    "restored": g.restored,
                }
                for g in groups
            ],
        )
        oldest = min(groups, key=lambda g: g.version)
        result = RolloutResult(
            trajectories=[t for g in groups for t in g.result.trajectories],
            retried=[t for g in groups for t in g.result.retried],
        )
        return Batch(
            step,
            oldest.version,
            oldest.policy_version,
            result,
            None,
            None,
            wall_s=max(g.wall_s for g in groups),
            versions=tuple(g.version for g in groups),
        )

    # -- checkpoints ---------------------------------------------------------------------------

    def write_state(self, folder: Path, next_step: int) -> None:
        queue, live = self.queue, self.versions.live
        started = [
            StartedGroup(g, f.version, f.policy_version, f.part, f.sha256)
            for g, f in sorted(queue.finished.items())
            if f.part is not None and f.sha256 is not None
        ]
        running = queue.in_flight()
        started += [StartedGroup(g, v, live[v].version) for g, v in sorted(running.items())]
        versions = {i: (live[i].version, live[i].tensors) for i in set(running.values())}
        state = {
            "started": [asdict(s) for s in sorted(started, key=lambda s: s.group)],
            "trained_ahead": {p: s for p, s in self.trained_ahead.items() if s >= next_step},
            "versions": save_versions(folder, versions),
        }
        (folder / PIPELINE_FILE).write_text(json.dumps(state, sort_keys=True, indent=1) + "\n")

    def keep_on_resume(self, record: RunRecord, checkpoint: Checkpoint) -> frozenset[str]:
        """The parts a resume keeps: groups finished (before the checkpoint or after it, from a
        version it holds) and groups trained ahead of their planned step."""
        self.state, self.kept, self.resampled = None, {}, {}  # a resume may try older checkpoints
        state = load_arrivals(checkpoint.path)
        if state is None:
            return frozenset()
        self.state = (checkpoint.path, state)
        running = {s.group: s for s in state.started if s.part is None}
        late = self._late_parts(record, running)
        for s in state.started:
            if s.part is not None:
                self.kept[s.group] = s
            elif s.group in late:
                self.kept[s.group] = late[s.group]
            else:
                self.resampled[s.group] = s.version
        return frozenset([*state.trained_ahead, *(s.part for s in self.kept.values() if s.part)])

    def _late_parts(self, record: RunRecord, running: dict[int, StartedGroup]) -> dict[int, StartedGroup]:
        """Running groups whose part was written after the checkpoint, from the same version."""
        by_id = {self.group_jobs(g)[0].group_id: s for g, s in running.items()}
        steps = {self.schedule.planned_step(g) for g in running}
        found: dict[int, StartedGroup] = {}
        for path, step, digest in find_parts(record.path):
            if step not in steps:
                continue
            table = pq.ParquetFile(path).read(columns=["split", "group_id", "policy_version"])  # type: ignore[no-untyped-call]
            groups = set(table.column("group_id").to_pylist())
            s = by_id.get(groups.pop()) if len(groups) == 1 else None
            if s is None or set(table.column("split").to_pylist()) != {Split.TRAIN.value}:
                continue
            if set(table.column("policy_version").to_pylist()) - {""} == {s.policy_version}:
                part = path.relative_to(record.path).as_posix()
                found[s.group] = StartedGroup(s.group, s.version, s.policy_version, part, digest)
        return found

    async def restore(self, start: int) -> None:
        self.queue.taken = start
        self.first_group = start * self.schedule.per_step
        if self.state is None:
            return
        folder, state = self.state
        for index in sorted(set(self.resampled.values())):
            self.versions.publish(index, version_tensors(folder, index))
            self.versions.open(index)
        for group, version in self.resampled.items():
            self.queue.restore(group, version)
        for s in sorted(self.kept.values(), key=lambda s: s.group):
            assert s.part is not None and s.sha256 is not None
            step = self.schedule.planned_step(s.group)
            result = read_result(self.record, s.part, step, s.sha256, s.policy_version)
            self.queue.restore(s.group, s.version)
            await self.queue.put(
                FinishedGroup(s.group, s.version, s.policy_version, result, s.part, s.sha256, restored=True)
            )
        self.trained_ahead = dict(state.trained_ahead)  # the next checkpoint's rewind keeps them too
        # Groups start in order, so every one before the first not yet started was: trained, or
        # outstanding (read back or to be sampled again).
        self.first_group += len(self.queue.due)
        self.record.event(
            "buffers_restored",
            from_step=start,
            groups=[{"group": s.group, "version": s.version, "part": s.part} for s in self.kept.values()],
            rollouts=sum(len(f.result.all()) for f in self.queue.finished.values()),
            resampled=[{"group": g, "version": v} for g, v in sorted(self.resampled.items())],
            versions=sorted(set(self.resampled.values())),
        )
