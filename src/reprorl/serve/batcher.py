"""The micro-batcher: requests that arrive within a few milliseconds are sampled as one batch, on one thread.

torch is not re-entrant here, so every call into the model (and the tokenizer, which the sampler
also uses) runs on a single worker thread. Requests queue on the event loop; the batcher waits a
short window after the first one, takes up to `max_batch` queued requests, and hands them to
`sampler.sample` together. While a batch runs, new requests queue, so under load batches fill
without waiting for the window.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from reprorl.policy.sampling import LocalSampler, Sample, SampleRequest

T = TypeVar("T")


@dataclass
class _Pending:
    request: SampleRequest
    future: asyncio.Future[Sample]


@dataclass
class BatchStats:
    """What the batcher has done since it started: served batches, rows, and the largest batch."""

    batches: int = 0
    requests: int = 0
    largest_batch: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"batches": self.batches, "requests": self.requests, "largest_batch": self.largest_batch}


class MicroBatcher:
    """Collects concurrent sample requests into batches for one `LocalSampler` on one thread."""

    def __init__(self, sampler: LocalSampler, *, window_s: float = 0.005, max_batch: int = 32) -> None:
        if max_batch < 1 or window_s < 0:
            raise ValueError("max_batch must be at least 1 and window_s not negative")
        self.sampler = sampler
        self.window_s = window_s
        self.max_batch = max_batch
        self.stats = BatchStats()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reprorl-sampler")
        self._queue: asyncio.Queue[_Pending] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._serve(self._queue), name="reprorl-batcher")

    async def stop(self) -> None:
        """Stop taking batches, fail what is still queued, and wait for the running batch."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._queue is not None and not self._queue.empty():
            pending = self._queue.get_nowait()
            if not pending.future.done():
                pending.future.set_exception(RuntimeError("the server is shutting down"))
        await asyncio.get_running_loop().run_in_executor(None, self._worker.shutdown)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` on the model thread (tokenizing and decoding share it with sampling)."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    async def submit(self, request: SampleRequest) -> Sample:
        """Queue one request and wait for its sample."""
        if self._queue is None:
            raise RuntimeError("the batcher has not been started")
        future: asyncio.Future[Sample] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(request, future))
        return await future

    async def _serve(self, queue: asyncio.Queue[_Pending]) -> None:
        while True:
            batch = [await queue.get()]
            if self.window_s > 0 and queue.qsize() < self.max_batch - 1:
                await asyncio.sleep(self.window_s)
            while len(batch) < self.max_batch and not queue.empty():
                batch.append(queue.get_nowait())
            # A client that went away no longer waits; its row would only slow the others.
            live = [p for p in batch if not p.future.done()]
            if live:
                await self._sample(live)

    async def _sample(self, batch: list[_Pending]) -> None:
        try:
            samples = await self.run(self.sampler.sample, [p.request for p in batch])
        except BaseException as exc:
            # Cancelled at shutdown or failed: either way no row of this batch gets a sample.
            error = exc if isinstance(exc, Exception) else RuntimeError("the server is shutting down")
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(error)
            if not isinstance(exc, Exception):
                raise
            return
        self.stats.batches += 1
        self.stats.requests += len(batch)
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
        for pending, sample in zip(batch, samples, strict=True):
            if not pending.future.done():
                pending.future.set_result(sample)
