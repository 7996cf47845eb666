"""Recorded sampling batches, followed: a rerun samples every turn in the batch the record says it shared.

Under the ready lockstep which turns share a batch depends on timing, and floating-point results
depend on the batch, so a plain rerun differs in its last bits. Every turn records its batch (the
keys of its rows, in slot order); `RecordedBatches` holds each request until every row of its
recorded batch has asked, then samples those rows together in that order, so the same weights
give the same bits. Keys are compared relative to their run (`<kind>/<step>/<task>/<member>/<turn>`),
since the rerun has a run id of its own.

A rerun can leave its record: a request the record does not hold or holds with another context or
seed, a row sampled to other tokens, an episode that ends before its recorded turns. The first
such place is kept (`TurnSchedule.diverged`) and from then on requests are batched as they come, so
the rerun finishes (and its differences are reported) instead of waiting for a batch that cannot
fill.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from reprorl.hashing import canonical_json, sha256_hex
from reprorl.policy.sampling import Sample, Sampler, SampleRequest
from reprorl.rollout.model_policy import Future, Lockstep, PoolRound
from reprorl.types import Trajectory, sample_key

Row = tuple[SampleRequest, Future]


def request_digest(prompt_ids: tuple[int, ...], seed: int) -> str:
    """What makes a request the same request: its context and its seed (the spec fixes the rest)."""
    return sha256_hex(canonical_json([list(prompt_ids), seed]).encode())


def tokens_digest(token_ids: tuple[int, ...]) -> str:
    return sha256_hex(canonical_json(list(token_ids)).encode())


@dataclass(frozen=True)
class RecordedTurn:
    """One sampled turn of the record: its batch (relative keys, slot order) and what it was."""

    batch: tuple[str, ...]
    request: str  # request_digest of its context and seed
    tokens: str  # tokens_digest of what it sampled (up to its stop string, where one cut it)
    kept: int | None = None  # where a stop string cut it: how many of the sampled tokens it kept

    def same_tokens(self, token_ids: tuple[int, ...]) -> bool:
        return tokens_digest(token_ids if self.kept is None else token_ids[: self.kept]) == self.tokens


@dataclass
class TurnSchedule:
    """Every sampled turn of a recorded run by relative key, and where a rerun first left it."""

    run_id: str  # the recorded run's id, which its keys start with
    turns: dict[str, RecordedTurn]
    diverged: str | None = None
    followed: int = 0  # batches sampled as recorded
    _turns_of: Counter[str] = field(default_factory=Counter, repr=False)
    _groups: dict[str, set[str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._turns_of = Counter(key.rpartition("/")[0] for key in self.turns)
        for rollout in self._turns_of:
            self._groups.setdefault(group_of(rollout), set()).add(rollout)

    def recorded_turns(self, rollout: str) -> int:
        """How many sampled turns the record holds for a rollout (relative id)."""
        return self._turns_of[rollout]

    def rollouts(self, group: str) -> set[str]:
        """The recorded rollouts of a group (relative id): every member's every attempt."""
        return self._groups.get(group, set())

    def diverge(self, where: str) -> None:
        if self.diverged is None:
            self.diverged = where


class ScheduleError(Exception):
    """A record's schedule cannot be followed; the message says why."""


def turn_schedule(trajectories: Iterable[Trajectory], run_id: str) -> TurnSchedule:
    """Every sampled turn of `trajectories` (a run's: all splits, retried attempts too) by relative
    key; `ScheduleError` if a turn has no recorded batch or the batches disagree."""
    turns = {}
    for t in trajectories:
        rollout = relative(t.rollout_id, run_id)
        for turn in t.turns:
            if turn.seed is None:
                continue
            context = t.context_ids(turn.index)
            # A turn's other choices (an agent's n > 1) were sampled in batches of their own.
            for row in turn.sampled_rows():
                key = sample_key(rollout, turn.index, row.choice)
                if not row.batch:
                    raise ScheduleError(f"turn {key} records no sampling batch (a remote sampler's)")
                batch = tuple(relative(k, run_id) for k in row.batch)
                assert row.seed is not None
                kept = len(row.token_ids) if row.stop is not None else None
                turns[key] = RecordedTurn(
                    batch, request_digest(context, row.seed), tokens_digest(row.token_ids), kept
                )
    for key, recorded in turns.items():
        for name in recorded.batch:
            other = turns.get(name)
            if other is None or other.batch != recorded.batch:
                raise ScheduleError(f"turn {key}'s batch names {name}, whose record says otherwise")
    return TurnSchedule(run_id, turns)


def group_of(rollout: str) -> str:
    """A rollout's group: `<group>/<member>[~attempt]` -> `<group>`."""
    return rollout.rpartition("/")[0]


def relative(key: str, run_id: str) -> str:
    """A key or rollout id without its run's id: `<run_id>/rest` -> `rest`."""
    return key[len(run_id) + 1 :] if key.startswith(run_id + "/") else key


class RecordedBatches(Lockstep):
    """One sampler's requests, each sampled in its recorded batch, rows in their recorded order."""

    def __init__(self, sampler: Sampler, schedule: TurnSchedule, run_id: str, *, max_batch: int) -> None:
        super().__init__(sampler, max_batch=max_batch)
        self.schedule, self.run_id = schedule, run_id  # run_id: the rerun's own
        self._rows: dict[str, Row] = {}  # relative key -> waiting row, in the order they came
        self._asked: Counter[str] = Counter()  # relative rollout id -> turns requested

    def join(self, lane: int) -> None:
        return None

    def leave(self, lane: int) -> None:
        return None

    def enqueue(self, lane: int, request: SampleRequest, priority: int) -> tuple[Any, Future]:
        key = relative(request.key, self.run_id)
        self._asked[key.rpartition("/")[0]] += 1
        recorded = self.schedule.turns.get(key)
        if recorded is None:
            self.schedule.diverge(f"{key}: the record has no such turn")
        elif recorded.request != request_digest(request.prompt_ids, request.seed):
            self.schedule.diverge(f"{key}: its context or seed differs from the record's")
        future: Future = asyncio.get_running_loop().create_future()
        self._rows[key] = (request, future)
        return key, future

    async def wait(self, slot: Any, future: Future) -> tuple[Sample, float]:
        try:
            sample, cpu = await future
        except asyncio.CancelledError:
            # A lane cut off by its wall-time limit: its recorded batch can no longer fill.
            if self._rows.get(slot, (None, None))[1] is future:
                del self._rows[slot]
                self.schedule.diverge(f"{slot}: cut off while it waited for its recorded batch")
            self._maybe_fire()
            raise
        recorded = self.schedule.turns.get(slot)
        if recorded is not None and not recorded.same_tokens(sample.token_ids):
            self.schedule.diverge(f"{slot}: sampled other tokens than the record's")
        return sample, cpu

    def finished(self, rollouts: set[str]) -> None:
        """These rollouts (relative ids) will ask for nothing more: their recorded turns must all
        have been asked for, or the batches holding the rest can never fill."""
        for rollout in sorted(rollouts):
            if self._asked[rollout] < self.schedule.recorded_turns(rollout):
                self.schedule.diverge(
                    f"{rollout}: ended after {self._asked[rollout]} of its "
                    f"{self.schedule.recorded_turns(rollout)} recorded turns"
                )
        self._maybe_fire()

    def _maybe_fire(self) -> None:
        if self._running or not self._rows:
            return
        batch = list(self._rows) if self.schedule.diverged is not None else self._complete()
        if batch is None:
            return
        if self.schedule.diverged is None:
            self.schedule.followed += 1
        rows = [self._rows.pop(key) for key in batch]
        self._running = True
        asyncio.get_running_loop().create_task(self._run(rows))

    def _complete(self) -> list[str] | None:
        """The recorded batch of the longest-waiting row whose batch is all here, if any (once off
        the record, the caller batches whatever is waiting, as it came)."""
        for key in self._rows:
            recorded = self.schedule.turns.get(key)
            if recorded is not None and all(k in self._rows for k in recorded.batch):
                return list(recorded.batch)
        return None


class RecordedRound(PoolRound):
    """A group's round into `RecordedBatches`; when its lanes are done it says which rollouts ended."""

    def __init__(self, pool: RecordedBatches) -> None:
        super().__init__(pool)
        self.recorded = pool
        self._groups: set[str] = set()  # relative ids of the groups its lanes have sampled for

    async def sample(self, lane: int, request: SampleRequest) -> tuple[Sample, float]:
        self._groups.add(group_of(relative(request.key, self.recorded.run_id).rpartition("/")[0]))
        return await super().sample(lane, request)

    def leave(self, lane: int) -> None:
        super().leave(lane)
        if not self._lanes:
            # Every member's every attempt ran on this round's lanes: the group has ended.
            schedule = self.recorded.schedule
            self.recorded.finished(set().union(*(schedule.rollouts(g) for g in self._groups)))
