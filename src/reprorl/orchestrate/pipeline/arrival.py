"""Arrival-order batches: the trainer takes groups as they finish, each trained by its staleness deadline.

With `learning.pipeline.source = "arrival"` a run's groups form one sequence — group j is the (j mod B)-th
group the synchronous loop plans for step j // B, with that step's task draw and seeds — and the
producer starts them in order, each from the newest open policy version. A group sampled from
version v must be trained by its deadline d(v) = min(v + max_staleness, e - 1, steps - 1), where e
is the first eval point after v (eval points stay barriers: every eval measures its step's weights,
and nothing sampled before it is trained after it).

The bound is kept by pacing, never by dropping. A group starts only if every group started could
still be trained in time: for every D, the groups due by D fit in the batches left up to D
(`Schedule.admits`). Step n takes the B finished groups due earliest, once taking them leaves the
rest feasible (`Schedule.choose`), so the trainer waits only for a group that is due now, or that
must go now for a later step to fit. Earliest deadline first is optimal for such unit jobs: no step
ever takes a batch that makes a later one impossible, and every group started is trained.

Which version samples a group and which step trains it depend on timing; both are recorded (each
rollout's `policy_version`, each step's `batch_assembled` event). A group's rollouts are stored as
one part under its planned step as soon as it finishes.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from reprorl.orchestrate.pipeline.batches import VersionUser, cancel_all, gather_or_fail, stored
from reprorl.orchestrate.pipeline.executors import BatchRunner
from reprorl.orchestrate.pipeline.versions import PolicyVersion, PolicyVersions
from reprorl.rollout.runner import RolloutJob, RolloutResult
from reprorl.store.rollouts import RolloutWriter


@dataclass(frozen=True)
class Schedule:
    """The staleness deadlines of one run's groups and the rules that keep every group on time."""

    per_step: int  # B: groups per batch
    max_staleness: int
    every_steps: int  # eval points: step 0, every N steps, the last
    steps: int

    @property
    def groups(self) -> int:
        return self.steps * self.per_step

    def planned_step(self, group: int) -> int:
        return group // self.per_step

    def deadline(self, version: int) -> int:
        """The last step that may train a group sampled from `version`."""
        barrier = (version // self.every_steps + 1) * self.every_steps
        return min(version + self.max_staleness, barrier - 1, self.steps - 1)

    def fits(self, due: Iterable[int], taken: int) -> bool:
        """Whether groups with these deadlines can all be trained on time, `taken` batches in."""
        counts, total = Counter(due), 0
        for deadline in sorted(counts):
            total += counts[deadline]
            if deadline < taken or total > (deadline - taken + 1) * self.per_step:
                return False
        return True

    def admits(self, due: Iterable[int], version: int, taken: int) -> bool:
        """Whether one more group, from `version`, keeps the outstanding groups (`due`) feasible."""
        return self.fits([*due, self.deadline(version)], taken)

    def choose(self, finished: Mapping[int, int], due: Mapping[int, int], taken: int) -> list[int] | None:
        """The next batch: the B finished groups due earliest (index breaks ties), in index order,
        if taking them leaves every other outstanding group trainable in time; else None (wait).

        `finished` and `due` map group index to deadline; `due` holds every outstanding group.
        """
        pick = sorted(finished, key=lambda g: (finished[g], g))[: self.per_step]
        if len(pick) < self.per_step:
            return None
        chosen = set(pick)
        rest = [d for g, d in due.items() if g not in chosen]
        return sorted(pick) if self.fits(rest, taken + 1) else None


@dataclass(frozen=True)
class FinishedGroup:
    """One sampled group, the version that sampled it, and its stored part."""

    index: int
    version: int
    policy_version: str
    result: RolloutResult
    part: str | None  # relative to the run folder
    sha256: str | None
    wall_s: float = 0.0
    restored: bool = False  # read back from the store rather than sampled by this process


class Decided(Protocol):
    """What a recorded run decided of its arrival order: each group's version, each step's groups."""

    @property
    def versions(self) -> Mapping[int, int]: ...

    @property
    def steps(self) -> Mapping[int, Sequence[int]]: ...


@dataclass(frozen=True)
class Undecided:
    """Nothing decided in advance: the schedule's rules decide as groups start and finish."""

    versions: Mapping[int, int] = field(default_factory=dict)
    steps: Mapping[int, Sequence[int]] = field(default_factory=dict)


class ArrivalQueue:
    """Where the producer and the trainer meet: groups started (with deadlines), finished, taken.

    `decided` (a recorded run's choices, `timing.py`) starts each group it names from its recorded
    version and gives each step it names its recorded groups, in their order; everything else the
    schedule's rules decide."""

    def __init__(self, schedule: Schedule, *, taken: int = 0, decided: Decided | None = None) -> None:
        self.schedule = schedule
        self.decided: Decided = decided if decided is not None else Undecided()
        self.due: dict[int, int] = {}  # every outstanding group -> its deadline
        self.versions: dict[int, int] = {}  # every outstanding group -> the version sampling it
        self.finished: dict[int, FinishedGroup] = {}
        self.taken = taken  # batches taken
        self.newest = -1  # the newest open policy version
        self._changed = asyncio.Condition()
        self._failure: BaseException | None = None

    async def open_version(self, index: int) -> None:
        async with self._changed:
            self.newest = index
            self._changed.notify_all()

    def restore(self, group: int, version: int) -> None:
        """An outstanding group a checkpoint named (finished or not)."""
        self.due[group] = self.schedule.deadline(version)
        self.versions[group] = version

    async def admit(self, group: int) -> int:
        """Wait until `group` may start from the newest version without endangering a deadline (or,
        when decided, until its recorded version is open); returns that version."""
        recorded = self.decided.versions.get(group)

        def admissible() -> bool:
            if recorded is not None:  # started once its version is open, as it was
                return self.newest >= recorded
            return self.newest >= 0 and self.schedule.admits(self.due.values(), self.newest, self.taken)

        async with self._changed:
            await self._changed.wait_for(lambda: admissible() or self._failure is not None)
            self._raise()
            version = recorded if recorded is not None else self.newest
            self.restore(group, version)
            return version

    async def put(self, group: FinishedGroup) -> None:
        if group.index not in self.due or group.index in self.finished:
            raise RuntimeError(f"group {group.index} finished but is not outstanding: it would train twice")
        async with self._changed:
            self.finished[group.index] = group
            self._changed.notify_all()

    async def fail(self, exc: BaseException) -> None:
        async with self._changed:
            self._failure = exc
            self._changed.notify_all()

    async def take(self, step: int) -> list[FinishedGroup]:
        """Step `step`'s groups, in index order (or as recorded), as soon as the schedule (or the
        record) lets it have them."""
        if step != self.taken:
            raise RuntimeError(f"batch {step} asked for after {self.taken} batches were taken")
        recorded = self.decided.steps.get(step)

        def choice() -> list[int] | None:
            if recorded is not None:
                return list(recorded) if all(g in self.finished for g in recorded) else None
            finished = {g: self.due[g] for g in self.finished}
            return self.schedule.choose(finished, self.due, self.taken)

        async with self._changed:
            await self._changed.wait_for(lambda: choice() is not None or self._failure is not None)
            picked = choice()
            if picked is None:
                self._raise()
            assert picked is not None
            for g in picked:
                del self.due[g], self.versions[g]
            self.taken += 1
            self._changed.notify_all()
            return [self.finished.pop(g) for g in picked]

    def _raise(self) -> None:
        if self._failure is not None:
            # The producer's own error (a bad task is the user's, and says so), not a wrapper.
            raise self._failure

    def in_flight(self) -> dict[int, int]:
        """Outstanding groups not finished yet, with their versions."""
        return {g: v for g, v in self.versions.items() if g not in self.finished}

    @property
    def depth(self) -> int:
        return len(self.finished)


class GroupProducer(VersionUser):
    """Starts the run's groups in order, each as soon as the schedule admits it, and queues each
    finished group (stored first, failed rollouts too)."""

    def __init__(
        self,
        batches: BatchRunner,
        versions: PolicyVersions,
        queue: ArrivalQueue,
        writer: RolloutWriter,
        *,
        jobs: Callable[[int], Sequence[RolloutJob]],
    ) -> None:
        super().__init__(batches, versions)
        self.queue, self.writer, self.jobs = queue, writer, jobs

    async def run(self, first: int, resampled: Mapping[int, int]) -> None:
        """Sample `resampled` (in-flight groups a checkpoint named, with their versions) again,
        then start groups `first` onwards."""
        tasks: set[asyncio.Task[None]] = set()
        try:
            for group, index in sorted(resampled.items()):
                tasks.add(asyncio.create_task(self._sample(group, await self.hold(index))))
            for group in range(first, self.queue.schedule.groups):
                version = await self.hold(await self.queue.admit(group))
                tasks.add(asyncio.create_task(self._sample(group, version)))
        except BaseException as exc:
            await cancel_all(tasks, exc, self.queue.fail)
            raise
        await gather_or_fail(tasks, self.queue.fail)

    async def _sample(self, group: int, version: PolicyVersion) -> None:
        started = time.perf_counter()
        # Earliest deadline first at the sampler too. Groups start in order and a deadline never
        # falls along that order, so the index is one, ties going to the group started first: a
        # group the trainer must take next is not queued behind later ones, and while the
        # pipeline fills the first groups finish first instead of all finishing late together.
        jobs = [replace(job, priority=group) for job in self.jobs(group)]
        try:
            result = await self.batches.run(version, jobs, first_group=group)
            part = self.writer.write(jobs[0].step, result.all())
        finally:
            self.release(version)
        path, digest = stored(self.writer, part)
        wall_s = time.perf_counter() - started
        finished = FinishedGroup(group, version.index, version.version, result, path, digest, wall_s=wall_s)
        await self.queue.put(finished)
