"""The rollout runner: lockstep batches, token-in/token-out turns, retries, and the full record.

The sampler here is scripted (it returns fixed replies as real tokens of the real tokenizer): the
subject is the code around it — batching, contexts, episodes, retries and records.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from reprorl.actions import render_call
from reprorl.config import NoiseSpec, PriceTable
from reprorl.envs.base import EnvConfig
from reprorl.errors import UserInputError
from reprorl.policy import LoadedModel, tiny_model
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import Sample, SampleRequest
from reprorl.rollout import FAMILIES
from reprorl.rollout.episode import EpisodeLimits, Provenance
from reprorl.rollout.runner import (
    Barrier,
    BatchBarrier,
    GroupBarrier,
    ReadyBarrier,
    RolloutRunner,
    plan_groups,
)
from reprorl.types import SamplingParams, Split, Task, Termination, ToolOutcome, Trajectory


class ScriptedSampler:
    """Turn 0 calls the calculator, turn 1 answers; records every request it was given."""

    policy_version = "scripted:1"

    def __init__(self, model: LoadedModel, fail: dict[str, int] | None = None) -> None:
        self.tokenizer = model.tokenizer
        self.eos = int(model.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.requests: list[SampleRequest] = []
        self.batches: list[tuple[str, ...]] = []
        self.fail = dict(fail or {})  # rollout key -> failures left
        self.lock = threading.Lock()

    def info(self) -> dict[str, Any]:
        return {"kind": "scripted"}

    def sample(self, requests: Sequence[SampleRequest]) -> list[Sample]:
        with self.lock:
            self.requests.extend(requests)
            self.batches.append(tuple(r.key for r in requests))
            for r in requests:
                base = re.sub(r"~\d+", "", r.key)  # every attempt of the rollout fails alike
                if self.fail.get(base, 0) > 0:
                    self.fail[base] -= 1
                    raise ConnectionError(f"sampler lost {r.key}")
        out = []
        for r in requests:
            turn = int(r.key.rsplit("/", 1)[1])
            text = render_call("calc", {"expression": f"{r.seed % 97} + 1"}) if turn == 0 else "42"
            ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + ([self.eos] if turn else [])
            out.append(
                Sample(
                    key=r.key,
                    token_ids=tuple(ids),
                    logprobs=tuple(-0.5 for _ in ids),
                    finish_reason="stop" if turn else "tool_call",
                    text=text,
                    batch=tuple(q.key for q in requests),
                    policy_version=self.policy_version,
                )
            )
        return out


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return tiny_model(0)


def _tasks(n: int) -> list[Task]:
    return list(FAMILIES["calculator"].generate(0, train=n, eval=0, holdout=0)[Split.TRAIN].tasks)


def _runner(sampler: ScriptedSampler, renderer: ChatRenderer, **settings: Any) -> RolloutRunner:
    return RolloutRunner(
        sampler,
        renderer,
        run_id="r",
        params=SamplingParams(max_tokens=64),
        provenance=Provenance("sha256:base", None, renderer.template_hash, sampler.info()),
        limits=EpisodeLimits(max_turns=4, wall_s=60),
        **settings,
    )


def _run(
    sampler: ScriptedSampler,
    renderer: ChatRenderer,
    tasks: list[Task],
    *,
    group: int = 3,
    concurrency: int = 32,
    env_config: EnvConfig | None = None,
    prices: PriceTable | None = None,
    barrier: Barrier | None = None,
) -> tuple[list[Trajectory], list[Trajectory]]:
    async def go() -> tuple[list[Trajectory], list[Trajectory]]:
        async with _runner(
            sampler, renderer, env_config=env_config, prices=prices, concurrency=concurrency, barrier=barrier
        ) as runner:
            result = await runner.run(plan_groups(tasks, group, run_id="r", run_seed=1, step=2))
            return result.trajectories, result.retried

    return asyncio.run(go())


def test_turns_append_tokens_and_record_everything(model: LoadedModel) -> None:
    sampler, renderer = ScriptedSampler(model), ChatRenderer(model.tokenizer)
    finals, retried = _run(sampler, renderer, _tasks(2), prices=PriceTable(completion_usd_per_mtok=2.0))
    assert len(finals) == 6 and not retried
    seen = {r.key: r.prompt_ids for r in sampler.requests}
    for t in finals:
        assert [turn.index for turn in t.turns] == [0, 1] and t.termination is Termination.ANSWERED
        assert t.turns[0].tool_results[0].outcome is ToolOutcome.OK
        for turn in t.turns:
            # The context the sampler saw is exactly what the record rebuilds, token for token.
            assert seen[f"{t.rollout_id}/{turn.index}"] == t.context_ids(turn.index)
            assert turn.rerender_ok is True and turn.policy_version == "scripted:1"
            assert turn.seed is not None and f"{t.rollout_id}/{turn.index}" in turn.batch
        # Token-in/token-out: turn 1's context extends turn 0's context and sampled tokens.
        assert t.context_ids(1)[: len(t.context_ids(0)) + len(t.turns[0].token_ids)] == (
            t.context_ids(0) + t.turns[0].token_ids
        )
        assert t.prompt_template_hash == renderer.template_hash and t.base_model_hash == "sha256:base"
        assert (t.step, t.sampler) == (2, {"kind": "scripted"})
        assert t.prompt_tokens == len(t.turns[0].prompt_token_ids) + len(t.turns[1].prompt_token_ids)
        assert t.cost_usd == pytest.approx(t.completion_tokens * 2.0 / 1e6)
        assert t.cost_usd > 0
    members = {
        t.group_id: sorted(t.member for t in finals if t.group_id == g) for g in {t.group_id for t in finals}
    }
    assert all(m == [0, 1, 2] for m in members.values())
    assert len({t.sampling.seed for t in finals}) == 6
    assert len({t.turns[0].seed for t in finals} | {t.turns[1].seed for t in finals}) == 12


def test_batches_are_the_same_whatever_the_tool_latency(model: LoadedModel) -> None:
    """Random tool delays reorder when episodes finish their calls, never what is batched together."""
    renderer = ChatRenderer(model.tokenizer)
    jittery = EnvConfig(noise=NoiseSpec(jitter_s=0.05))
    runs = []
    for _ in range(2):
        sampler = ScriptedSampler(model)
        finals, _ = _run(sampler, renderer, _tasks(3), group=2, concurrency=4, env_config=jittery)
        runs.append((sampler.batches, [[t.batch for t in traj.turns] for traj in finals]))
    assert runs[0] == runs[1]
    first_batch = runs[0][0][0]
    assert len(first_batch) == 4  # four lanes share the first barrier
    assert all(len(b) <= 4 for b in runs[0][0])


def test_a_group_barrier_batches_each_group_alone_whatever_the_latency(model: LoadedModel) -> None:
    """With the group barrier a turn waits for its own group's members only: every batch holds one
    group's turns, all of its members that are still running, and reruns under random tool delays
    build the same batches; at most concurrency // group size groups run at once."""
    renderer = ChatRenderer(model.tokenizer)
    jittery = EnvConfig(noise=NoiseSpec(jitter_s=0.05))
    runs = []
    for _ in range(2):
        sampler = ScriptedSampler(model)
        finals, _ = _run(
            sampler, renderer, _tasks(4), group=3, concurrency=6, env_config=jittery, barrier=GroupBarrier()
        )
        runs.append(sampler.batches)
        assert len(finals) == 12 and all(t.termination is Termination.ANSWERED for t in finals)
    assert sorted(runs[0]) == sorted(runs[1])
    assert len(runs[0]) == 8  # two turns of each of the four groups
    for batch in runs[0]:
        groups = {key.rsplit("/", 2)[0] for key in batch}
        assert len(groups) == 1 and len(batch) == 3
    # Four groups of three at concurrency 6: two at a time (a group runs from its first batch to
    # its last), so two overlap but never three.
    order = [batch[0].rsplit("/", 2)[0] for batch in runs[0]]
    spans = {g: (order.index(g), len(order) - 1 - order[::-1].index(g)) for g in set(order)}
    overlap = [sum(a <= i <= b for a, b in spans.values()) for i in range(len(order))]
    assert max(overlap) == 2


def test_the_batch_barrier_is_the_default_and_spans_the_groups(model: LoadedModel) -> None:
    renderer = ChatRenderer(model.tokenizer)
    default, explicit = ScriptedSampler(model), ScriptedSampler(model)
    _run(default, renderer, _tasks(2), group=3)
    _run(explicit, renderer, _tasks(2), group=3, barrier=BatchBarrier())
    assert default.batches == explicit.batches and len(default.batches) == 2
    assert all(len(b) == 6 for b in default.batches)


def test_an_infra_failure_is_retried_and_kept_apart(model: LoadedModel) -> None:
    renderer = ChatRenderer(model.tokenizer)
    key = "r/train/2/calculator-train-0000/1/0"  # fails in its batch, then alone: one retry
    always = "r/train/2/calculator-train-0001/0/1"
    sampler = ScriptedSampler(model, fail={key: 2, always: 10})
    finals, retried = _run(sampler, renderer, _tasks(2), group=2)
    by_id = {t.rollout_id: t for t in finals}
    recovered = by_id["r/train/2/calculator-train-0000/1~1"]
    assert recovered.termination is Termination.ANSWERED and recovered.infra_retries == 1
    lost = by_id["r/train/2/calculator-train-0001/0~2"]
    assert lost.termination is Termination.INFRA_ERROR and lost.infra_retries == 2
    assert "sampler lost" in (lost.error or "")
    assert sorted(t.rollout_id for t in retried) == [
        "r/train/2/calculator-train-0000/1",
        "r/train/2/calculator-train-0001/0",
        "r/train/2/calculator-train-0001/0~1",
    ]
    assert all(t.retried and t.termination is Termination.INFRA_ERROR for t in retried)
    # The rest of the batch went on: every other rollout answered at its first attempt.
    others = [t for t in finals if t not in (lost, recovered)]
    assert len(others) == 2
    assert all(t.termination is Termination.ANSWERED and t.infra_retries == 0 for t in others)


def test_bad_tasks_are_refused_before_any_episode(model: LoadedModel) -> None:
    task = _tasks(1)[0]
    sampler = ScriptedSampler(model)
    with pytest.raises(UserInputError, match=r"tools \['calculator'\] are not tools of the 'calculator' env"):
        _run(sampler, ChatRenderer(model.tokenizer), [task.model_copy(update={"tools": ("calculator",)})])
    with pytest.raises(UserInputError, match="no env family 'chess'"):
        _run(sampler, ChatRenderer(model.tokenizer), [task.model_copy(update={"family": "chess"})])
    assert sampler.requests == []


def test_plan_groups_seeds() -> None:
    tasks = _tasks(2)
    a = plan_groups(tasks, 4, run_id="x", run_seed=9, step=0)
    assert a == plan_groups(tasks, 4, run_id="x", run_seed=9, step=0)
    assert len({j.seed for j in a}) == 8
    assert {j.seed for j in a}.isdisjoint(
        j.seed for j in plan_groups(tasks, 4, run_id="x", run_seed=9, step=1)
    )
    assert {j.seed for j in a}.isdisjoint(
        j.seed for j in plan_groups(tasks, 4, run_id="x", run_seed=10, step=0)
    )
    assert a[5].rollout_id == f"x/train/0/{tasks[1].id}/1" and a[5].group_id == f"x/train/0/{tasks[1].id}"
    with pytest.raises(ValueError):
        plan_groups(tasks, 0, run_id="x", run_seed=1, step=0)


class SlowSampler(ScriptedSampler):
    """A scripted sampler that takes a while per batch, so requests pile up behind it."""

    def sample(self, requests: Sequence[SampleRequest]) -> list[Sample]:
        time.sleep(0.05)
        return super().sample(requests)


def test_an_arrival_barrier_batches_whole_groups_across_calls(model: LoadedModel) -> None:
    """A group's turns wait for each other, then join the turns of other `run` calls on the same
    sampler (as the arrival producer's groups do): batches hold whole groups, from several calls;
    every episode ends, and each turn records the batch it was sampled in."""
    renderer = ChatRenderer(model.tokenizer)
    sampler = SlowSampler(model)

    async def go() -> list[Trajectory]:
        async with _runner(sampler, renderer, concurrency=8, max_batch=4, barrier=ReadyBarrier()) as runner:
            calls = [
                runner.run(plan_groups([task], 2, run_id="r", run_seed=1, step=s))
                for s, task in enumerate(_tasks(4))
            ]
            return [t for result in await asyncio.gather(*calls) for t in result.trajectories]

    finals = asyncio.run(go())
    assert len(finals) == 8 and all(t.termination is Termination.ANSWERED for t in finals)
    assert all(len(b) <= 4 for b in sampler.batches)
    for batch in sampler.batches:  # both members of a group, at the same turn
        rows = Counter((key.split("/")[2], key.rsplit("/", 1)[1]) for key in batch)
        assert set(rows.values()) == {2}, batch
    calls_per_batch = [len({key.split("/")[2] for key in batch}) for batch in sampler.batches]
    assert max(calls_per_batch) > 1  # one lockstep across the calls
    assert len(sampler.batches) < 16  # 16 turns, fewer batches: they were shared
    for t in finals:
        for i, turn in enumerate(t.turns):
            assert turn.batch is not None and f"{t.rollout_id}/{i}" in turn.batch
