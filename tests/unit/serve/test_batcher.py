"""The micro-batcher: concurrent requests share batches, run on one thread, and fail together."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import cast

import pytest

from reprorl.policy.sampling import LocalSampler, Sample, SampleRequest
from reprorl.serve import MicroBatcher
from reprorl.types import SamplingParams


class FakeSampler:
    """Records each batch and the thread it ran on; echoes each request's seed as its token."""

    def __init__(self, fail: bool = False, delay_s: float = 0.0) -> None:
        self.batches: list[tuple[str, ...]] = []
        self.threads: set[int] = set()
        self.fail = fail
        self.delay_s = delay_s

    def sample(self, requests: Sequence[SampleRequest]) -> list[Sample]:
        self.threads.add(threading.get_ident())
        self.batches.append(tuple(r.key for r in requests))
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("model exploded")
        keys = tuple(r.key for r in requests)
        return [
            Sample(
                key=r.key, token_ids=(r.seed,), logprobs=(-1.0,), finish_reason="length", text="", batch=keys
            )
            for r in requests
        ]


def request(i: int) -> SampleRequest:
    return SampleRequest(key=f"k{i}", prompt_ids=(1, 2), params=SamplingParams(max_tokens=1), seed=i)


async def submit_all(batcher: MicroBatcher, n: int) -> list[Sample]:
    await batcher.start()
    try:
        return list(await asyncio.gather(*(batcher.submit(request(i)) for i in range(n))))
    finally:
        await batcher.stop()


def test_concurrent_requests_are_batched_up_to_the_limit_on_one_thread() -> None:
    fake = FakeSampler(delay_s=0.01)
    batcher = MicroBatcher(cast(LocalSampler, fake), window_s=0.02, max_batch=4)
    samples = asyncio.run(submit_all(batcher, 10))
    assert [s.token_ids for s in samples] == [(i,) for i in range(10)]  # each caller gets its own row
    assert sorted(k for batch in fake.batches for k in batch) == sorted(f"k{i}" for i in range(10))
    assert max(len(b) for b in fake.batches) == 4 and len(fake.batches) == 3
    assert len(fake.threads) == 1 and threading.get_ident() not in fake.threads
    assert batcher.stats.as_dict() == {"batches": 3, "requests": 10, "largest_batch": 4}


def test_a_failing_batch_fails_each_of_its_requests() -> None:
    batcher = MicroBatcher(cast(LocalSampler, FakeSampler(fail=True)), window_s=0.01)
    with pytest.raises(RuntimeError, match="model exploded"):
        asyncio.run(submit_all(batcher, 3))
    assert batcher.stats.batches == 0


def test_submit_before_start_is_refused() -> None:
    batcher = MicroBatcher(cast(LocalSampler, FakeSampler()))
    with pytest.raises(RuntimeError, match="not been started"):
        asyncio.run(batcher.submit(request(0)))
