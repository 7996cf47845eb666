"""Arrival-order batches: the schedule's deadlines, admission and choice, and the queue between the
producer and the trainer, driven by random finishing orders."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import pytest

from reprorl.config import load_spec
from reprorl.orchestrate.jobs.reproduce import timing_dependent
from reprorl.orchestrate.pipeline.arrival import ArrivalQueue, FinishedGroup, GroupProducer, Schedule
from reprorl.orchestrate.pipeline.versions import PolicyVersion
from reprorl.rollout import FAMILIES
from reprorl.rollout.runner import RolloutJob, RolloutResult, plan_groups
from reprorl.types import Split


def test_a_deadline_is_the_staleness_bound_cut_at_the_next_eval_point_and_the_last_step() -> None:
    s = Schedule(per_step=2, max_staleness=2, every_steps=4, steps=10)
    assert [s.deadline(v) for v in range(10)] == [2, 3, 3, 3, 6, 7, 7, 7, 9, 9]
    assert [Schedule(2, 0, 4, 10).deadline(v) for v in range(4)] == [0, 1, 2, 3]


def test_admission_counts_the_batches_left_before_each_deadline() -> None:
    s = Schedule(per_step=2, max_staleness=1, every_steps=100, steps=10)
    # Version 0, nothing taken: groups due by step 1 fit in two batches of two.
    assert s.admits([1, 1, 1], version=0, taken=0)
    assert not s.admits([1, 1, 1, 1], version=0, taken=0)
    # A group from version 0 is due at step 1; once batch 1 is taken there is no room for it.
    assert not s.admits([], version=0, taken=2)
    assert s.admits([2, 2, 2], version=1, taken=1)


def test_choice_takes_the_earliest_deadlines_and_waits_for_a_group_due_now() -> None:
    s = Schedule(per_step=2, max_staleness=2, every_steps=100, steps=10)
    due = {0: 2, 1: 2, 2: 3, 3: 3, 5: 4}
    assert s.fits(due.values(), taken=1) and s.fits(due.values(), taken=2)
    # Choosing step 2's batch: groups 0 and 1 are due now, so it waits for both, whatever else is done.
    assert s.choose({2: 3, 3: 3}, due, taken=2) is None
    assert s.choose({0: 2, 3: 3}, due, taken=2) is None
    assert s.choose({0: 2, 1: 2, 3: 3}, due, taken=2) == [0, 1]
    # One batch earlier there is room for one of them to wait: group 0 goes first, with group 3.
    assert s.choose({0: 2, 3: 3, 5: 4}, due, taken=1) == [0, 3]
    assert not s.fits([2, 2, 2], taken=2)
    # Three groups due by step 3 and one batch left before it: two of them must go now.
    assert s.choose({3: 3, 5: 4}, {2: 3, 3: 3, 4: 3, 5: 4}, taken=3) is None
    # Late groups need not wait: with room, the fastest finished go first.
    roomy = {5: 4, 6: 4, 7: 4}
    assert s.choose({6: 4, 7: 4}, roomy, taken=2) == [6, 7]
    assert s.choose({6: 4}, roomy, taken=2) is None  # a batch is always whole


def _duration(rng: random.Random, members: int = 4) -> int:
    """A group's episodes in ticks: its slowest member's heavy-tailed tool latency, plus sampling."""
    return 1 + int(max(rng.lognormvariate(1.0, 1.0) for _ in range(members)))


@dataclass
class Simulation:
    """The producer, the trainer and random episode durations, in discrete time."""

    schedule: Schedule
    seed: int
    train_ticks: int = 6
    due: dict[int, int] = field(default_factory=dict)
    version_of: dict[int, int] = field(default_factory=dict)
    finish_at: dict[int, int] = field(default_factory=dict)
    trained: dict[int, int] = field(default_factory=dict)  # group -> step

    def run(self) -> int:
        rng = random.Random(self.seed)
        s, now, taken, next_group = self.schedule, 0, 0, 0
        newest, training_until, waited = 0, -1, 0
        while taken < s.steps:
            now += 1
            assert now < 100_000, "the schedule deadlocked"
            if training_until == now:
                newest = taken  # the update done, its version opens
            while next_group < s.groups and s.admits(self.due.values(), newest, taken):
                self.due[next_group] = s.deadline(newest)
                self.version_of[next_group] = newest
                self.finish_at[next_group] = now + _duration(rng)
                next_group += 1
            if training_until > now:
                continue
            finished = {g: d for g, d in self.due.items() if self.finish_at[g] <= now}
            picked = s.choose(finished, self.due, taken)
            if picked is None:
                waited += 1
                continue
            for g in picked:
                del self.due[g]
                self.trained[g] = taken
            taken += 1
            training_until = now + self.train_ticks
        return waited


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize(("staleness", "every"), [(0, 100), (1, 100), (2, 3), (4, 100), (4, 2)])
def test_every_group_is_trained_once_within_its_bound_whatever_the_finishing_order(
    seed: int, staleness: int, every: int
) -> None:
    schedule = Schedule(per_step=3, max_staleness=staleness, every_steps=every, steps=12)
    sim = Simulation(schedule, seed)
    sim.run()
    assert sorted(sim.trained) == list(range(schedule.groups))  # none dropped, none twice
    per_step = [sum(step == n for step in sim.trained.values()) for n in range(schedule.steps)]
    assert per_step == [3] * schedule.steps
    for group, step in sim.trained.items():
        version = sim.version_of[group]
        assert 0 <= step - version <= staleness
        # No group crosses an eval point: every eval measures its step's weights.
        assert step // every == version // every


@pytest.mark.parametrize("staleness", [1, 2, 4])
def test_taking_groups_as_they_finish_waits_less_than_the_planned_order(staleness: int) -> None:
    """With heavy-tailed episodes the trainer waits less than when it takes each step's planned
    groups (it must wait for the slowest of those); the staleness bound still caps the gain, since
    a group must finish within about `staleness` updates of its start either way."""
    schedule = Schedule(per_step=4, max_staleness=staleness, every_steps=1000, steps=40)
    arrival = sum(Simulation(schedule, seed).run() for seed in range(10))
    planned = sum(_planned_wait(schedule, seed) for seed in range(10))
    assert arrival < 0.97 * planned, (arrival, planned)


def _planned_wait(schedule: Schedule, seed: int, train_ticks: int = 6) -> int:
    """The same durations, planned order: step s's groups start once version s - k is open."""
    rng = random.Random(seed)
    k, B = schedule.max_staleness, schedule.per_step
    opened, finish, now, waited = {0: 0}, {}, 0, 0
    for step in range(schedule.steps):
        start = opened[max(step - k, 0)]
        for g in range(step * B, (step + 1) * B):
            finish[g] = start + 1 + _duration(rng)
        ready = max(finish[g] for g in range(step * B, (step + 1) * B))
        waited += max(0, ready - now)
        now = max(now, ready) + train_ticks
        opened[step + 1] = now
    return waited


def _group(index: int, version: int) -> FinishedGroup:
    return FinishedGroup(index, version, f"v{version}", RolloutResult([]), None, None)


def test_the_queue_paces_the_producer_and_hands_the_trainer_whole_feasible_batches() -> None:
    async def go() -> list[list[int]]:
        queue = ArrivalQueue(Schedule(per_step=2, max_staleness=1, every_steps=100, steps=3))
        await queue.open_version(0)
        versions = [await queue.admit(g) for g in range(4)]  # two batches' worth from version 0
        assert versions == [0, 0, 0, 0]
        fifth = asyncio.create_task(queue.admit(4))
        await asyncio.sleep(0.01)
        assert not fifth.done()  # a fifth group from version 0 could not be trained in time
        for g in (3, 2):
            await queue.put(_group(g, 0))
        first = await queue.take(0)
        await asyncio.sleep(0.01)
        assert not fifth.done()  # still only version 0 open: groups 0 and 1 fill batch 1
        await queue.open_version(1)
        assert await fifth == 1
        second = asyncio.create_task(queue.take(1))
        await queue.put(_group(4, 1))
        await queue.put(_group(0, 0))
        await asyncio.sleep(0.01)
        assert not second.done()  # group 1 is due at step 1 and still running
        await queue.put(_group(1, 0))
        taken = [[g.index for g in first], [g.index for g in await second]]
        with pytest.raises(RuntimeError, match="would train twice"):
            await queue.put(_group(0, 0))  # a group sampled again after it was trained
        return taken

    assert asyncio.run(go()) == [[2, 3], [0, 1]]


def test_a_producer_failure_reaches_the_trainer() -> None:
    async def go() -> None:
        queue = ArrivalQueue(Schedule(per_step=1, max_staleness=1, every_steps=100, steps=2))
        await queue.open_version(0)
        await queue.admit(0)
        waiting = asyncio.create_task(queue.take(0))
        await queue.fail(ValueError("task t1: bad tools"))
        await waiting

    with pytest.raises(ValueError, match="bad tools"):
        asyncio.run(go())


ASYNC_ARRIVAL = ["learning.pipeline.max_staleness=1", "learning.pipeline.source=arrival"]


def _pinned(name: str) -> str:
    return f"{name}@v1"


def test_a_reproduction_names_the_settings_that_make_a_run_depend_on_timing() -> None:
    with resources.as_file(resources.files("reprorl") / "configs" / "demo.toml") as path:
        planned = load_spec(path, ["learning.pipeline.max_staleness=1"], pin_bare=_pinned)
        arrival = load_spec(path, ASYNC_ARRIVAL, pin_bare=_pinned)
        both = load_spec(path, [*ASYNC_ARRIVAL, "learning.pipeline.lockstep=ready"], pin_bare=_pinned)
    assert timing_dependent(planned) == ()
    (note,) = timing_dependent(arrival)
    assert note.startswith("learning.pipeline.source = 'arrival'") and "batch_assembled" in note
    assert [n.split(":")[0] for n in timing_dependent(both)] == [
        "learning.pipeline.source = 'arrival'",
        "learning.pipeline.lockstep = 'ready'",
    ]


class _Versions:
    """Policy versions as the producer sees them: each one exists once asked for."""

    def __init__(self) -> None:
        self.live: dict[int, Any] = {}

    async def wait(self, index: int) -> Any:
        return self.live.setdefault(index, PolicyVersion(index, f"v{index}", {}, None, None))  # type: ignore[arg-type]

    def retire_below(self, index: int) -> None:
        return None


class _Batches:
    """A batch runner that samples nothing and notes each group's version and job priorities."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, list[int]]] = []

    async def publish(self, version: Any) -> None:
        return None

    async def retire_below(self, index: int) -> None:
        return None

    async def run(self, version: Any, jobs: Any, *, first_group: int = 0) -> RolloutResult:
        self.runs.append((version.index, [job.priority for job in jobs]))
        return RolloutResult([])


class _Writer:
    def write(self, step: int, trajectories: Any) -> None:
        return None


def test_the_producer_gives_each_group_its_start_order_as_its_sampling_priority() -> None:
    """Earliest deadline first at the sampler too: every job of a group carries the group's place in
    the start order, along which deadlines never fall, so the open lockstep samples the groups due
    soonest first and, among those due together, the first started."""
    tasks = list(FAMILIES["calculator"].generate(0, train=4, eval=0, holdout=0)[Split.TRAIN].tasks)
    schedule = Schedule(per_step=1, max_staleness=2, every_steps=100, steps=4)

    def jobs(group: int) -> list[RolloutJob]:
        return plan_groups([tasks[group]], 2, run_id="r", run_seed=1, step=group)

    async def go() -> list[tuple[int, list[int]]]:
        queue, batches = ArrivalQueue(schedule), _Batches()
        producer = GroupProducer(batches, _Versions(), queue, _Writer(), jobs=jobs)  # type: ignore[arg-type]
        await queue.open_version(0)
        running = asyncio.create_task(producer.run(0, {}))
        await asyncio.sleep(0.05)  # groups 0-2 start from version 0 (due by step 2); group 3 cannot
        await queue.take(0)
        await queue.open_version(1)
        await asyncio.wait_for(running, timeout=5)
        return batches.runs

    runs = asyncio.run(go())
    assert runs == [(0, [0, 0]), (0, [1, 1]), (0, [2, 2]), (1, [3, 3])]
    deadlines = [schedule.deadline(version) for version, _ in runs]
    assert deadlines == sorted(deadlines) == [2, 2, 2, 3]  # the order is earliest deadline first
