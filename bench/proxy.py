"""The agent proxy's cost: per request against calling the sampler directly, and throughput under load.

Three figures, each measured in this run:

1. Overhead per request. The same continued conversation goes through the proxy (the official
   `openai` client → HTTP → history check → token context → sampler) with a sampler that answers
   instantly, so what is left is the proxy's own time; it is printed as a share of one SmolLM2-135M
   turn (a `--turn-tokens` reply sampled directly, the best of `--repeat`). Target: ≤ 5%.
2. Requests/s at `--agents` concurrent agents on the tiny model, batched by the run's open lockstep
   as in training, against the same requests sampled directly in batches of the same size (the bound).
3. A 10 MB request body refused, alone and while the agents run: milliseconds to the 413.

    python bench/proxy.py [--agents 64] [--turns 4] [--turn-tokens 64] [--repeat 3] [--quick]

`--quick` uses the tiny model for the SmolLM2 turn too: a smoke run, not a measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import openai
import torch
from timing import best_of

from reprorl.policy import load_base, tiny_model
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import LocalSampler, Sample, SampleRequest
from reprorl.rollout.agents import AgentProxy, Exchange, ExchangeLimits
from reprorl.rollout.model_policy import OpenLockstep
from reprorl.types import Message, Role, SamplingParams, Split, Termination, Trajectory

ASK = [{"role": "user", "content": "What is 17 * 23? Think, then answer with a number."}]


class Instant:
    """A sampler that answers at once with fixed tokens: what remains is the proxy's time."""

    policy_version = "instant"

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = tuple(ids)

    def sample(self, requests: Sequence[SampleRequest]) -> list[Sample]:
        keys = tuple(r.key for r in requests)
        return [
            Sample(r.key, self.ids, (-0.5,) * len(self.ids), "stop", "391", keys, "instant") for r in requests
        ]


class Loop:
    """An event loop on its own thread, hosting the proxy as a run would."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()


def _exchange(proxy: AgentProxy, renderer: ChatRenderer, submit: Any, name: str, turns: int) -> Exchange:
    exchange = Exchange(
        rollout_id=name,
        key=AgentProxy.new_key(),
        renderer=renderer,
        submit=submit,
        params=SamplingParams(max_tokens=16),
        seed_of=lambda turn: turn,
        limits=ExchangeLimits(max_turns=turns + 1, max_tokens=1 << 30),
    )
    proxy.open(exchange)
    return exchange


def _conversation(client: openai.OpenAI, turns: int) -> None:
    messages: list[dict[str, Any]] = list(ASK)
    for turn in range(turns):
        reply = client.chat.completions.create(model="policy", messages=messages)  # type: ignore[arg-type]
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}]
        messages += [{"role": "user", "content": f"And once more ({turn})?"}]


def overhead(loop: Loop, renderer: ChatRenderer, turns: int, repeat: int) -> float:
    """Seconds the proxy adds to one request (the median over a conversation, best of `repeat`)."""
    sampler = Instant(renderer.encode("391"))
    proxy = loop.run(_start(AgentProxy()))

    async def submit(request: SampleRequest) -> tuple[Sample, float]:
        return sampler.sample([request])[0], 0.0

    per_request = []
    for attempt in range(repeat + 1):  # the first is a warm-up
        exchange = loop.run(_open(proxy, renderer, submit, f"overhead/{attempt}", turns))
        client = openai.OpenAI(
            base_url=proxy.base_url(exchange.rollout_id), api_key=exchange.key, max_retries=0
        )
        started = time.perf_counter()
        _conversation(client, turns)
        if attempt:
            per_request.append((time.perf_counter() - started) / turns)
    loop.run(proxy.__aexit__(None, None, None))
    return min(per_request)


async def _start(proxy: AgentProxy) -> AgentProxy:
    return await proxy.__aenter__()


async def _open(proxy: AgentProxy, renderer: ChatRenderer, submit: Any, name: str, turns: int) -> Exchange:
    return _exchange(proxy, renderer, submit, name, turns)


def smollm_turn(quick: bool, tokens: int, repeat: int) -> tuple[float, str]:
    """Seconds of one directly sampled turn of exactly `tokens` tokens (stop tokens switched off)."""
    loaded = tiny_model(0) if quick else load_base()
    renderer = ChatRenderer(loaded.tokenizer)
    sampler = LocalSampler(loaded.model, loaded.tokenizer, model_hash=loaded.base_hash, policy_version="base")
    sampler.stop_strings, sampler.stop_ids = (), frozenset()
    request = SampleRequest("turn", _prompt(renderer), SamplingParams(max_tokens=tokens), seed=1)
    return best_of(lambda: sampler.sample([request]), repeat), loaded.name


def _prompt(renderer: ChatRenderer) -> tuple[int, ...]:
    return tuple(renderer.prompt_ids([Message(role=Role.USER, content=str(ASK[0]["content"]))], []))


async def _agents(proxy: AgentProxy, exchanges: list[Exchange], turns: int) -> float:
    """Seconds for every agent to hold its conversation (clients made before the clock starts)."""
    clients = [
        openai.AsyncOpenAI(base_url=proxy.base_url(e.rollout_id), api_key=e.key, max_retries=0, timeout=600)
        for e in exchanges
    ]

    async def one(client: openai.AsyncOpenAI) -> None:
        messages: list[dict[str, Any]] = list(ASK)
        for turn in range(turns):
            reply = await client.chat.completions.create(model="policy", messages=messages)  # type: ignore[arg-type]
            messages += [{"role": "assistant", "content": reply.choices[0].message.content}]
            messages += [{"role": "user", "content": f"And once more ({turn})?"}]

    started = time.perf_counter()
    await asyncio.gather(*(one(c) for c in clients))
    wall = time.perf_counter() - started
    for client in clients:
        await client.close()
    return wall


def under_load(loop: Loop, agents: int, turns: int) -> dict[str, float]:
    tiny = tiny_model(0)
    renderer = ChatRenderer(tiny.tokenizer)
    sampler = LocalSampler(tiny.model, tiny.tokenizer, model_hash=tiny.base_hash, policy_version="base")
    proxy = loop.run(_start(AgentProxy()))
    lockstep: OpenLockstep = loop.run(_make_lockstep(sampler, agents))

    async def submit(request: SampleRequest) -> tuple[Sample, float]:
        return await lockstep.sample(0, request)

    exchanges = [loop.run(_open(proxy, renderer, submit, f"load/{i}", turns)) for i in range(agents)]
    refused_alone = _refuse_huge(proxy, exchanges[0])
    client_loop = asyncio.new_event_loop()
    done: list[float] = []
    runner = threading.Thread(
        target=lambda: done.append(client_loop.run_until_complete(_agents(proxy, exchanges, turns)))
    )
    runner.start()
    time.sleep(0.5)
    refused_busy = _refuse_huge(proxy, exchanges[0])
    runner.join()
    wall = done[0]
    requests = agents * turns
    # The bound: each turn's recorded contexts sampled directly, in one batch per turn, no HTTP.
    direct = 0.0
    for turn in range(turns):
        batch = [
            SampleRequest(f"d/{i}/{turn}", _context(e, turn), SamplingParams(max_tokens=16), seed=turn)
            for i, e in enumerate(exchanges)
        ]
        direct += best_of(functools.partial(sampler.sample, batch), 2)
    loop.run(proxy.__aexit__(None, None, None))
    batches = lockstep.batches
    return {
        "requests_per_s": requests / wall,
        "direct_requests_per_s": requests / direct,
        "batches": float(batches),
        "mean_batch": requests / max(batches, 1),
        "refused_alone_ms": refused_alone * 1000,
        "refused_busy_ms": refused_busy * 1000,
    }


def _context(exchange: Exchange, turn: int) -> tuple[int, ...]:
    record = Trajectory(
        run_id="bench",
        rollout_id=exchange.rollout_id,
        split=Split.TRAIN,
        task_id="bench",
        task_hash="bench",
        termination=Termination.ANSWERED,
        turns=tuple(exchange.turns),
    )
    return record.context_ids(turn)


async def _make_lockstep(sampler: LocalSampler, agents: int) -> OpenLockstep:
    return OpenLockstep(sampler, max_batch=agents)


# The 10 MB client is a process of its own, as an agent is: its time is not shared with this one's.
_POSTER = """
import json, statistics, sys, time, httpx
url, key = sys.argv[1], sys.argv[2]
body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "x" * 10_000_000}]}).encode()
headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
times = []
with httpx.Client(timeout=60) as client:
    for _ in range(5):
        started = time.perf_counter()
        response = client.post(url, content=body, headers=headers)
        times.append(time.perf_counter() - started)
        assert response.status_code == 413, response.text
print(statistics.median(times))
"""


def _refuse_huge(proxy: AgentProxy, exchange: Exchange) -> float:
    url = proxy.base_url(exchange.rollout_id) + "/chat/completions"
    done = subprocess.run(
        [sys.executable, "-c", _POSTER, url, exchange.key], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"the 10 MB client failed: {done.stderr[-2000:]}")
    return float(done.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the tiny model for the turn too: a smoke run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loop = Loop()
    tiny = tiny_model(0)
    added = overhead(loop, ChatRenderer(tiny.tokenizer), args.turns, args.repeat)
    turn_s, name = smollm_turn(args.quick, args.turn_tokens, args.repeat)
    print(f"proxy overhead per request: {added * 1000:.2f} ms")
    print(f"one {name} turn of {args.turn_tokens} tokens, sampled directly: {turn_s * 1000:.0f} ms")
    print(f"overhead / turn: {added / turn_s:.3%}  (target <= 5%)")
    load = under_load(loop, args.agents, args.turns)
    print(
        f"{args.agents} concurrent agents x {args.turns} turns on the tiny model: "
        f"{load['requests_per_s']:.1f} req/s through the proxy, {load['direct_requests_per_s']:.1f} req/s "
        f"sampled directly in batches of {args.agents} "
        f"(ratio {load['requests_per_s'] / load['direct_requests_per_s']:.2f}); "
        f"mean batch {load['mean_batch']:.1f}"
    )
    print(
        f"10 MB body refused (413) in {load['refused_alone_ms']:.0f} ms alone, "
        f"{load['refused_busy_ms']:.0f} ms while the agents run"
    )


if __name__ == "__main__":
    main()
