"""Recorded batches, followed: a rerun samples each turn in its recorded batch and slot order, and
says where it first left the record instead of waiting for a batch that cannot fill.

The sampler is scripted (fixed replies as real tokens): the subject is the batching around it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from test_runner import ScriptedSampler, SlowSampler, _runner, _tasks

from reprorl.policy import LoadedModel, tiny_model
from reprorl.policy.chat import ChatRenderer
from reprorl.rollout.episode import EpisodeLimits
from reprorl.rollout.recorded_batches import (
    ScheduleError,
    TurnSchedule,
    relative,
    turn_schedule,
)
from reprorl.rollout.runner import Barrier, ReadyBarrier, plan_groups
from reprorl.types import Termination, Trajectory


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return tiny_model(0)


def _run(
    sampler: ScriptedSampler,
    model: LoadedModel,
    run_id: str,
    barrier: Barrier,
    *,
    seed: int = 1,
    limits: EpisodeLimits | None = None,
) -> list[Trajectory]:
    """Four calls of two groups of two (as the arrival producer's groups), all at once."""
    renderer = ChatRenderer(model.tokenizer)

    async def go() -> list[Trajectory]:
        async with _runner(sampler, renderer, concurrency=8, max_batch=4, barrier=barrier) as runner:
            runner.run_id = run_id
            runner.limits = limits or runner.limits
            calls = [
                runner.run(plan_groups(_tasks(8)[2 * s : 2 * s + 2], 2, run_id=run_id, run_seed=seed, step=s))
                for s in range(4)
            ]
            results = await asyncio.wait_for(asyncio.gather(*calls), timeout=120)
            return [t for result in results for t in result.all()]

    return asyncio.run(go())


def _relative(batches: Sequence[tuple[str, ...]], run_id: str) -> list[tuple[str, ...]]:
    return [tuple(relative(k, run_id) for k in batch) for batch in batches]


def _reversed(trajectories: list[Trajectory]) -> list[Trajectory]:
    """The same records with every batch's slot order reversed: a schedule no open batching makes."""
    return [
        t.model_copy(
            update={"turns": [turn.model_copy(update={"batch": turn.batch[::-1]}) for turn in t.turns]}
        )
        for t in trajectories
    ]


def test_a_rerun_samples_every_turn_in_its_recorded_batch_and_slot_order(model: LoadedModel) -> None:
    original = SlowSampler(model)
    recorded = _run(original, model, "r", ReadyBarrier())
    assert len(original.batches) < 16 and max(len(b) for b in original.batches) > 2  # shared batches
    schedule = turn_schedule(_reversed(recorded), "r")
    rerun = ScriptedSampler(model)  # another speed, so open batching would batch otherwise
    again = _run(rerun, model, "q", ReadyBarrier(follow=schedule, run_id="q"))
    want = sorted(b[::-1] for b in _relative(original.batches, "r"))
    assert sorted(_relative(rerun.batches, "q")) == want
    assert schedule.diverged is None and schedule.followed == len(original.batches)
    assert all(t.termination is Termination.ANSWERED for t in again)
    first = {relative(t.rollout_id, "r"): [turn.token_ids for turn in t.turns] for t in recorded}
    assert {relative(t.rollout_id, "q"): [turn.token_ids for turn in t.turns] for t in again} == first


def test_a_rerun_that_leaves_its_record_says_where_and_still_finishes(model: LoadedModel) -> None:
    recorded = _run(SlowSampler(model), model, "r", ReadyBarrier())
    schedule = turn_schedule(recorded, "r")
    # Other seeds: the very first request differs, and nothing waits for a batch that cannot fill.
    again = _run(ScriptedSampler(model), model, "q", ReadyBarrier(follow=schedule, run_id="q"), seed=2)
    assert schedule.diverged is not None and "its context or seed differs" in schedule.diverged
    assert len(again) == 16 and all(t.termination is Termination.ANSWERED for t in again)


def test_an_episode_ending_before_its_recorded_turns_is_named(model: LoadedModel) -> None:
    recorded = _run(SlowSampler(model), model, "r", ReadyBarrier())
    schedule = turn_schedule(recorded, "r")
    _run(
        ScriptedSampler(model),
        model,
        "q",
        ReadyBarrier(follow=schedule, run_id="q"),
        limits=EpisodeLimits(max_turns=1),
    )
    assert schedule.diverged is not None and "ended after 1 of its 2 recorded turns" in schedule.diverged


def test_records_whose_batches_disagree_cannot_be_followed(model: LoadedModel) -> None:
    recorded = _run(SlowSampler(model), model, "r", ReadyBarrier())
    one = recorded[0]
    changed = one.model_copy(
        update={
            "turns": [one.turns[0].model_copy(update={"batch": (f"{one.rollout_id}/0",)}), *one.turns[1:]]
        }
    )
    batch = recorded[0].turns[0].batch
    if len(batch) == 1:  # the row was alone in its batch: name a row of another batch instead
        changed = one.model_copy(
            update={"turns": [one.turns[0].model_copy(update={"batch": (*batch, "r/x/0")}), *one.turns[1:]]}
        )
    with pytest.raises(ScheduleError, match="whose record says otherwise"):
        turn_schedule([changed, *recorded[1:]], "r")
    unbatched = one.model_copy(update={"turns": [t.model_copy(update={"batch": ()}) for t in one.turns]})
    with pytest.raises(ScheduleError, match="records no sampling batch"):
        turn_schedule([unbatched], "r")
    assert isinstance(turn_schedule(recorded, "r"), TurnSchedule)
