"""The agent proxy as OpenAI clients see it: the official `openai` client and Inspect AI's providers.

A rollout is opened behind a real proxy (uvicorn on 127.0.0.1, on a loop of its own thread) with the
tiny model sampling for real; where a test needs a tool call, the sampler says a scripted reply in
the model's own tokens (`Saying`, as in the policy server's conformance test).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import httpx
import openai
import pytest
from test_openai_conformance import ASK, TOOLS, Saying

from reprorl.policy import tiny_model
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import LocalSampler, Sample, SampleRequest
from reprorl.rollout.agents import AgentProxy, Exchange, ExchangeLimits
from reprorl.types import SamplingParams, Termination


class Behind:
    """A proxy on a background loop, and rollouts opened behind it."""

    def __init__(self, sampler: LocalSampler, renderer: ChatRenderer) -> None:
        self.sampler, self.renderer = sampler, renderer
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.proxy = AgentProxy(max_body_bytes=1 << 20)
        self.call(self.proxy.__aenter__())
        self.opened = 0

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(120)

    async def _submit(self, request: SampleRequest) -> tuple[Sample, float]:
        (sample,) = await asyncio.to_thread(self.sampler.sample, [request])
        return sample, 0.0

    def open(self, *, max_turns: int = 8) -> Exchange:
        self.opened += 1
        exchange = Exchange(
            rollout_id=f"run/train/0/task-{self.opened}/0",
            key=AgentProxy.new_key(),
            renderer=self.renderer,
            submit=self._submit,
            params=SamplingParams(max_tokens=24, temperature=1.0),
            seed_of=lambda turn: 1000 + turn,
            limits=ExchangeLimits(max_turns=max_turns, max_tokens=10_000),
        )

        async def add() -> None:
            self.proxy.open(exchange)

        self.call(add())
        return exchange

    def client(self, exchange: Exchange, *, by_key: bool = False) -> openai.OpenAI:
        base = (
            f"http://127.0.0.1:{self.proxy.port}/v1" if by_key else self.proxy.base_url(exchange.rollout_id)
        )
        return openai.OpenAI(base_url=base, api_key=exchange.key, timeout=60.0, max_retries=0)

    def close(self) -> None:
        self.call(self.proxy.__aexit__(None, None, None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _behind(sampler_type: type[LocalSampler]) -> Iterator[Behind]:
    tiny = tiny_model(0)
    sampler = sampler_type(tiny.model, tiny.tokenizer, model_hash=tiny.base_hash, policy_version="base:test")
    behind = Behind(sampler, ChatRenderer(tiny.tokenizer))
    try:
        yield behind
    finally:
        behind.close()


@pytest.fixture(scope="module")
def real() -> Iterator[Behind]:
    yield from _behind(LocalSampler)


@pytest.fixture(scope="module")
def calling() -> Iterator[Behind]:
    yield from _behind(Saying)


def test_tool_calls_come_back_in_openai_shape_and_are_recorded(calling: Behind) -> None:
    exchange = calling.open()
    done = calling.client(exchange).chat.completions.create(model="policy", messages=ASK, tools=TOOLS)
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "I will compute it."
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "calc" and json.loads(call.function.arguments) == {"expression": "17 * 23"}
    (turn,) = exchange.turns
    assert turn.tool_calls[0].id == call.id and turn.finish_reason == "tool_call"
    # The result the agent sends back is recorded on the turn that called it.
    calling.client(exchange).chat.completions.create(
        model="policy",
        messages=[
            *ASK,
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "391"},
        ],
        tools=TOOLS,
    )
    assert [(r.name, r.content) for r in exchange.turns[0].tool_results] == [("calc", "391")]
    assert exchange.turns[1].context_reset is False


def test_a_streamed_tool_call_assembles_to_the_same_call(calling: Behind) -> None:
    exchange = calling.open()
    stream = calling.client(exchange).chat.completions.create(
        model="policy", messages=ASK, tools=TOOLS, stream=True
    )
    arguments, finish, name = "", None, None
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                name = delta.function.name or name if delta.function else name
                arguments += (delta.function.arguments or "") if delta.function else ""
            finish = choice.finish_reason or finish
    assert (name, json.loads(arguments), finish) == ("calc", {"expression": "17 * 23"}, "tool_calls")
    assert len(exchange.turns) == 1


def test_streamed_text_is_the_recorded_reply_with_usage(real: Behind) -> None:
    exchange = real.open()
    stream = real.client(exchange).chat.completions.create(
        model="policy", messages=ASK, stream=True, stream_options={"include_usage": True}
    )
    text, usage = "", None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
    (turn,) = exchange.turns
    assert text == turn.text and usage is not None and usage.completion_tokens == len(turn.token_ids)


def test_the_responses_api_returns_a_function_call_item(calling: Behind) -> None:
    exchange = calling.open()
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    response = calling.client(exchange).responses.create(
        model="policy", input="What is 17 * 23?", tools=tools
    )  # type: ignore[arg-type]
    calls = [item for item in response.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["calc"] and json.loads(calls[0].arguments) == {"expression": "17 * 23"}
    assert exchange.turns[0].tool_calls[0].name == "calc"


def test_the_responses_api_returns_the_recorded_text(real: Behind) -> None:
    exchange = real.open()
    response = real.client(exchange).responses.create(model="policy", input="What is 17 * 23?")
    (turn,) = exchange.turns
    assert response.output_text == turn.text and response.usage is not None
    assert response.usage.output_tokens == len(turn.token_ids)


def test_top_logprobs_are_the_recorded_logprobs_with_alternatives(real: Behind) -> None:
    exchange = real.open()
    done = real.client(exchange).chat.completions.create(
        model="policy", messages=ASK, logprobs=True, top_logprobs=5
    )
    content = done.choices[0].logprobs.content  # type: ignore[union-attr]
    (turn,) = exchange.turns
    assert [c.logprob for c in content] == list(turn.logprobs)
    assert all(len(c.top_logprobs) == 5 for c in content)
    assert all(c.top_logprobs[0].logprob >= c.logprob for c in content)


def test_a_rollout_is_reached_by_its_key_alone_and_refuses_other_keys(real: Behind) -> None:
    mine, other = real.open(), real.open()
    real.client(mine, by_key=True).chat.completions.create(model="policy", messages=ASK)
    assert len(mine.turns) == 1 and not other.turns
    intruder = openai.OpenAI(base_url=real.proxy.base_url(mine.rollout_id), api_key=other.key, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        intruder.chat.completions.create(model="policy", messages=ASK)
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=real.proxy.base_url("run/none"), api_key=mine.key, max_retries=0).models.list()
    assert len(mine.turns) == 1


def test_n_choices_are_recorded_and_the_one_sent_back_becomes_the_turn(real: Behind) -> None:
    exchange = real.open()
    client = real.client(exchange)
    done = client.chat.completions.create(model="policy", messages=ASK, n=4, logprobs=True)
    assert [c.index for c in done.choices] == [0, 1, 2, 3]
    logprobs = [[t.logprob for t in c.logprobs.content] for c in done.choices]  # type: ignore[union-attr]
    (turn,) = exchange.turns
    assert turn.choice == 0 and list(turn.logprobs) == logprobs[0]
    assert [a.choice for a in turn.alternatives] == [1, 2, 3]
    assert len({turn.seed, *(a.seed for a in turn.alternatives)}) == 4
    assert [list(a.logprobs) for a in turn.alternatives] == logprobs[1:]
    assert done.usage is not None and done.usage.completion_tokens == sum(map(len, logprobs))
    # The agent goes on from choice 2: the turn is now that row, and the history continues it.
    picked = done.choices[2].message.model_dump(exclude_none=True)
    client.chat.completions.create(
        model="policy", messages=[*ASK, picked, {"role": "user", "content": "And 2 * 3?"}]
    )
    first, second = exchange.turns
    assert first.choice == 2 and list(first.logprobs) == logprobs[2] and first.text == picked["content"]
    assert sorted(a.choice for a in first.alternatives) == [0, 1, 3]
    assert second.context_reset is False and exchange.divergences == 0


def test_n_is_bounded_and_stop_strings_are_checked(real: Behind) -> None:
    exchange = real.open()
    with pytest.raises(openai.BadRequestError, match="n must be"):
        real.client(exchange).chat.completions.create(model="policy", messages=ASK, n=17)
    with pytest.raises(openai.BadRequestError, match="stop takes"):
        real.client(exchange).chat.completions.create(model="policy", messages=ASK, stop=["a"] * 5)
    assert not exchange.turns


def test_a_stop_string_cuts_the_reply_and_the_recorded_tokens(calling: Behind) -> None:
    exchange = calling.open()
    done = calling.client(exchange).chat.completions.create(
        model="policy", messages=ASK, tools=TOOLS, stop=["compute"]
    )
    choice = done.choices[0]
    assert (choice.message.content, choice.finish_reason, choice.message.tool_calls) == (
        "I will ",
        "stop",
        None,
    )
    (turn,) = exchange.turns
    tokenizer = calling.renderer.tokenizer
    whole = tokenizer.encode(Saying.reply, add_special_tokens=False)
    assert turn.stop == "compute" and turn.text == "I will " and not turn.tool_calls
    assert list(turn.token_ids) == whole[: len(turn.token_ids)] and len(turn.token_ids) < len(whole)
    assert "compute" in tokenizer.decode(list(turn.token_ids)) and len(turn.logprobs) == len(turn.token_ids)


def test_the_turn_after_the_last_is_refused_and_ends_the_episode(real: Behind) -> None:
    exchange = real.open(max_turns=1)
    client = real.client(exchange)
    client.chat.completions.create(model="policy", messages=ASK)
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="policy", messages=ASK)
    assert refused.value.status_code == 409 and exchange.termination is Termination.MAX_TURNS
    assert exchange.over.is_set() and len(exchange.turns) == 1


def test_a_huge_body_is_refused_at_once_while_a_small_request_is_served(real: Behind) -> None:
    exchange = real.open()
    url = real.proxy.base_url(exchange.rollout_id) + "/chat/completions"
    huge = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "x" * 10_000_000}]})
    small: Future[httpx.Response] = Future()

    def ask_small() -> None:
        body = {"model": "policy", "messages": ASK}
        small.set_result(
            httpx.post(url, json=body, headers={"Authorization": f"Bearer {exchange.key}"}, timeout=60)
        )

    beside = threading.Thread(target=ask_small)
    beside.start()
    started = time.perf_counter()
    refused = httpx.post(url, content=huge, headers={"Authorization": f"Bearer {exchange.key}"}, timeout=60)
    took = time.perf_counter() - started
    beside.join(60)
    assert refused.status_code == 413 and "bytes" in refused.json()["error"]["message"]
    assert small.result().status_code == 200
    print(f"10 MB body refused in {took * 1000:.0f} ms")  # the figure; bench/proxy.py measures it too


@pytest.mark.parametrize("provider", ["openai-api", "openai"])
def test_inspect_ai_runs_an_eval_through_the_proxy(
    real: Behind, provider: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample as InspectSample
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate

    exchange = real.open()
    monkeypatch.setenv("REPRORL_API_KEY", exchange.key)
    monkeypatch.setenv("OPENAI_API_KEY", exchange.key)
    model = "openai-api/reprorl/policy" if provider == "openai-api" else "openai/policy"
    args = {} if provider == "openai-api" else {"responses_api": True}  # Inspect's openai/ default
    task = Task(
        dataset=[InspectSample(input="What is 2+2?", target="4")], solver=generate(), scorer=includes()
    )
    (log,) = inspect_eval(
        task,
        model=model,
        model_base_url=real.proxy.base_url(exchange.rollout_id),
        model_args=args,
        log_dir=str(tmp_path),
        display="none",
    )
    assert log.status == "success", log.error
    turn = exchange.turns[-1]
    assert log.samples and log.samples[0].output.completion == turn.text
    if len(exchange.turns) == 2:
        # Inspect's openai/ provider first asks for 'hello, world' to check the connection; the
        # sample's own conversation does not continue that one, and is recorded as diverged.
        assert turn.context_reset and turn.diverged_at == 0
    else:
        assert len(exchange.turns) == 1
