"""A model as an episode's policy: token-in/token-out contexts, sampled in deterministic lockstep batches.

Concurrent episodes share one sampler. `Lockstep` batches their requests so that a rerun with the
same seeds builds the same batches: episodes run in lanes, and a batch is sampled only when every
lane that is still working has asked for its next turn (or finished). Which requests share a batch
therefore depends on what the episodes did, never on how fast their tools happened to answer, and
floating-point results (which depend on the batch) are reproducible; each turn records its batch so
a replay can re-run it as it was. `OpenLockstep` gives that up for throughput: no barrier, batches
of whatever is waiting.

`ModelPolicy` holds one episode's context as token ids: the first prompt is rendered once, then
only sampled tokens and rendered tool results are appended (see `reprorl.policy.chat`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import Sample, Sampler, SampleRequest
from reprorl.rollout.episode import PolicyOutput
from reprorl.threads import off_loop
from reprorl.types import Message, SamplingParams

Future = asyncio.Future[tuple[Sample, float]]  # a waiting request's sample and CPU share


class Lockstep:
    """Batches sample requests from lanes of episodes at deterministic barriers."""

    def __init__(self, sampler: Sampler, *, max_batch: int = 32) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.sampler = sampler
        self.max_batch = max_batch
        self._lanes: set[int] = set()
        self._pending: dict[tuple[int, int], tuple[SampleRequest, Future]] = {}
        self._running = False
        self.batches = 0

    def join(self, lane: int) -> None:
        self._lanes.add(lane)

    def leave(self, lane: int) -> None:
        """The lane has no more episodes; stop waiting for it."""
        self._lanes.discard(lane)
        self._maybe_fire()

    async def sample(self, lane: int, request: SampleRequest, priority: int = 0) -> tuple[Sample, float]:
        """Wait for the barrier, then return this request's sample and its share of CPU seconds.

        `priority`: lower goes first where more requests wait than one batch holds (`OpenLockstep`)."""
        slot, future = self.enqueue(lane, request, priority)
        self._maybe_fire()
        return await self.wait(slot, future)

    def enqueue(self, lane: int, request: SampleRequest, priority: int) -> tuple[Any, Future]:
        """Put a request in line without firing, so that several can join one batch together."""
        slot = self._slot(lane, priority)
        future: Future = asyncio.get_running_loop().create_future()
        self._pending[slot] = (request, future)
        return slot, future

    async def wait(self, slot: Any, future: Future) -> tuple[Sample, float]:
        """An enqueued request's sample."""
        try:
            return await future
        except asyncio.CancelledError:
            # A lane cut off by its wall-time limit must not hold the others at the barrier.
            if self._pending.get(slot, (None, None))[1] is future:
                del self._pending[slot]
            self._maybe_fire()
            raise

    def fire(self) -> None:
        """Sample what is waiting, if the barrier lets it."""
        self._maybe_fire()

    def _slot(self, lane: int, priority: int) -> tuple[int, int]:
        """Where a lane's request waits: one request per lane, in lane order."""
        if lane not in self._lanes:
            raise RuntimeError(f"lane {lane} has not joined")
        return (0, lane)

    def _ready(self) -> bool:
        return self._lanes.issubset(lane for _, lane in self._pending)

    def _maybe_fire(self) -> None:
        if self._running or not self._pending or not self._ready():
            return
        batch = [self._pending.pop(slot) for slot in sorted(self._pending)]
        self._running = True
        asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[tuple[SampleRequest, Future]]) -> None:
        try:
            for start in range(0, len(batch), self.max_batch):
                await self._run_chunk(batch[start : start + self.max_batch])
        finally:
            self._running = False
            self._maybe_fire()

    async def _run_chunk(self, chunk: list[tuple[SampleRequest, Future]]) -> None:
        try:
            samples, cpu = await off_loop(self._sample, [r for r, _ in chunk])
        except Exception as exc:
            if len(chunk) > 1:
                # One bad request must not fail its neighbours: sample each row on its own, so
                # only the rows that fail alone become (retried) infra failures.
                for row in chunk:
                    await self._run_chunk([row])
                return
            if not chunk[0][1].done():
                chunk[0][1].set_exception(exc)
            return
        self.batches += 1
        for (_, future), sample in zip(chunk, samples, strict=True):
            if not future.done():
                # The sampler's own measure leaves out the time this batch waited for another
                # caller's batch on the same sampler (a group lockstep, an eval point).
                future.set_result((sample, cpu / len(chunk) if sample.cpu_s is None else sample.cpu_s))

    def _sample(self, requests: list[SampleRequest]) -> tuple[list[Sample], float]:
        started = time.process_time()
        samples = self.sampler.sample(requests)
        return samples, time.process_time() - started


class OpenLockstep(Lockstep):
    """No barrier: the requests waiting when the sampler comes free are sampled together, up to a
    batch, lowest priority first and then in the order they came (continuous batching at turn
    granularity).

    Nobody waits for a slow tool call, and one lockstep serves every episode on its sampler, so
    batches fill under load; which requests share a batch depends on timing. When more wait than a
    batch holds, the most urgent go first (the arrival producer gives a group its place in the start
    order: earliest deadline first), so a group the trainer is waiting for is not queued behind
    groups due later. Each
    turn still records its batch, so a replay re-runs it exactly.
    """

    def __init__(self, sampler: Sampler, *, max_batch: int = 32, window_s: float = 0.01) -> None:
        super().__init__(sampler, max_batch=max_batch)
        self.window_s = window_s  # how long an idle sampler waits for company for a first request
        self._tickets = 0
        self._timer: asyncio.TimerHandle | None = None

    def join(self, lane: int) -> None:
        return None

    def leave(self, lane: int) -> None:
        return None

    def _slot(self, lane: int, priority: int) -> tuple[int, int]:
        self._tickets += 1
        return (priority, self._tickets)

    def _ready(self) -> bool:
        return True

    def _maybe_fire(self) -> None:
        if self._running or not self._pending or self._timer is not None:
            return
        self._timer = asyncio.get_running_loop().call_later(self.window_s, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self._running or not self._pending:
            return
        # One batch at a time: a request arriving meanwhile may be more urgent than the rest.
        batch = [self._pending.pop(slot) for slot in sorted(self._pending)[: self.max_batch]]
        self._running = True
        asyncio.get_running_loop().create_task(self._run(batch))


class Gate(Protocol):
    """Where an episode lane's model turns wait to be sampled: a lockstep, or a round into a pool."""

    def join(self, lane: int) -> None: ...

    def leave(self, lane: int) -> None: ...

    async def sample(self, lane: int, request: SampleRequest) -> tuple[Sample, float]: ...


class PoolRound:
    """A group's lanes wait for each other, as in a lockstep, then go to a shared `OpenLockstep`
    together, where they are sampled with every other group's turns waiting at that moment.

    A group can finish only when its slowest member does, so waiting for its members costs the
    group little, and each sampling batch holds at least the group's live members."""

    def __init__(self, pool: Lockstep, priority: int = 0) -> None:
        self.pool, self.priority = pool, priority  # the group's priority in the pool
        self._lanes: set[int] = set()
        self._waiting: dict[int, tuple[SampleRequest, asyncio.Future[tuple[Any, Future]]]] = {}

    def join(self, lane: int) -> None:
        self._lanes.add(lane)

    def leave(self, lane: int) -> None:
        self._lanes.discard(lane)
        self._release()

    async def sample(self, lane: int, request: SampleRequest) -> tuple[Sample, float]:
        if lane not in self._lanes:
            raise RuntimeError(f"lane {lane} has not joined")
        ticket: asyncio.Future[tuple[Any, Future]] = asyncio.get_running_loop().create_future()
        self._waiting[lane] = (request, ticket)
        self._release()
        try:
            slot, future = await ticket
        except asyncio.CancelledError:
            # A lane cut off by its wall-time limit must not hold its group at the barrier.
            if self._waiting.get(lane, (None, None))[1] is ticket:
                del self._waiting[lane]
            self._release()
            raise
        return await self.pool.wait(slot, future)

    def _release(self) -> None:
        """Once every live lane has asked, put all their requests in the pool at once (in lane
        order), so that no batch can fire between two of them."""
        if not self._waiting or not self._lanes <= self._waiting.keys():
            return
        waiting, self._waiting = self._waiting, {}
        for lane in sorted(waiting):
            request, ticket = waiting[lane]
            if not ticket.done():
                ticket.set_result(self.pool.enqueue(lane, request, self.priority))
        self.pool.fire()


Submit = Callable[[SampleRequest], Awaitable[tuple[Sample, float]]]


class ModelPolicy:
    """One episode's model policy: appends to a token context, never re-renders it.

    `submit` samples one request (through a `Lockstep`, or a replay's recorded batch) and returns
    the sample with this row's share of CPU seconds.
    """

    def __init__(
        self,
        submit: Submit,
        renderer: ChatRenderer,
        params: SamplingParams,
        rollout_id: str,
        *,
        check_prefix: bool = True,
    ) -> None:
        self.submit, self.renderer = submit, renderer
        self.params, self.rollout_id, self.check_prefix = params, rollout_id, check_prefix
        self.context: list[int] = []
        self._last: tuple[int, ...] = ()
        self._seen = 0
        self._turn = 0

    async def act(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], *, seed: int
    ) -> PolicyOutput:
        if not self.context:
            added = self.renderer.prompt_ids(messages, tools)
        else:
            added = self.renderer.observation_ids(self._last, messages[self._seen :])
        self.context.extend(added)
        rerender_ok = (
            self.renderer.rerender_matches(messages, tools, self.context) if self.check_prefix else None
        )
        request = SampleRequest(
            key=f"{self.rollout_id}/{self._turn}",
            prompt_ids=tuple(self.context),
            params=self.params,
            seed=seed,
            # The context only grows: the sampler may keep this turn's keys and values for the next.
            continues=f"{self.rollout_id}/{self._turn - 1}" if self._turn else None,
            keep=True,
        )
        sample, cpu_s = await self.submit(request)
        self.context.extend(sample.token_ids)
        self._last = sample.token_ids
        self._seen = len(messages) + 1  # the episode appends this reply before the tool results
        self._turn += 1
        return PolicyOutput(
            text=sample.text,
            token_ids=sample.token_ids,
            logprobs=sample.logprobs,
            prompt_token_ids=tuple(added),
            policy_version=sample.policy_version,
            finish_reason=sample.finish_reason,
            seed=seed,
            batch=sample.batch,
            rerender_ok=rerender_ok,
            cpu_s=cpu_s,
            reused=sample.reused,
        )
