"""The open lockstep: requests waiting when the sampler comes free are batched, up to a batch at a
time, most urgent first and then in the order they came."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest
from test_runner import ScriptedSampler

from reprorl.policy import LoadedModel, tiny_model
from reprorl.policy.sampling import Sample, SampleRequest
from reprorl.rollout.model_policy import OpenLockstep
from reprorl.types import SamplingParams


class Held(ScriptedSampler):
    """A scripted sampler whose batches take a while, so that requests queue behind one."""

    def sample(self, requests: Sequence[SampleRequest]) -> list[Sample]:
        time.sleep(0.1)
        return super().sample(requests)


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return tiny_model(0)


def _request(name: str) -> SampleRequest:
    return SampleRequest(f"r/{name}/0", (1, 2, 3), SamplingParams(max_tokens=4), seed=len(name))


def test_the_most_urgent_waiting_requests_go_first_one_batch_at_a_time(model: LoadedModel) -> None:
    sampler = Held(model)

    async def go() -> None:
        pool = OpenLockstep(sampler, max_batch=2)
        first = asyncio.create_task(pool.sample(0, _request("first"), 9))
        await asyncio.sleep(0.05)  # the first batch is decoding: everything after it waits
        later = [("late-a", 5), ("urgent-a", 1), ("late-b", 5), ("urgent-b", 1), ("urgent-c", 1)]
        waiting = [asyncio.create_task(pool.sample(0, _request(name), p)) for name, p in later]
        await asyncio.gather(first, *waiting)

    asyncio.run(go())
    names = [[key.split("/")[1] for key in batch] for batch in sampler.batches]
    assert names == [["first"], ["urgent-a", "urgent-b"], ["urgent-c", "late-a"], ["late-b"]]
