"""The policy server as the official `openai` client sees it: tool calls in OpenAI's shape, `n`, `stop`,
and a body cap that refuses a huge request before parsing it.

The tiny model samples for real; where a test needs the model to call a tool, the sampler says a
scripted reply in the model's own tokens, so the server's reading of a call is what is tested.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import httpx
import openai
import pytest

from judge_server import serve
from reprorl.actions import render_call
from reprorl.policy import tiny_model
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.http import HttpSampler
from reprorl.policy.sampling import LocalSampler, Sample, SampleRequest
from reprorl.serve import create_app

MODEL = "tiny"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
ASK = [{"role": "user", "content": "What is 17 * 23?"}]
CALL = render_call("calc", {"expression": "17 * 23"})


class Saying(LocalSampler):
    """Samples for real, then replaces each row's tokens by those of `reply` (the scripted part)."""

    reply = "I will compute it. " + CALL

    def sample(self, requests: Sequence[SampleRequest]) -> list[Sample]:
        ids = tuple(self.tokenizer.encode(self.reply, add_special_tokens=False))
        return [
            replace(s, token_ids=ids, text=self.reply, logprobs=(-0.5,) * len(ids), finish_reason="tool_call")
            for s in super().sample(requests)
        ]


def served(sampler_type: type[LocalSampler]) -> Iterator[tuple[str, LocalSampler]]:
    tiny = tiny_model(0)
    sampler = sampler_type(tiny.model, tiny.tokenizer, model_hash=tiny.base_hash, policy_version="base:test")
    app = create_app(sampler, ChatRenderer(tiny.tokenizer), model_name=MODEL, max_body_bytes=1 << 20)
    with serve(app, lifespan="on") as url:
        yield url, sampler


@pytest.fixture(scope="module")
def real() -> Iterator[tuple[str, LocalSampler]]:
    yield from served(LocalSampler)


@pytest.fixture(scope="module")
def calling() -> Iterator[tuple[str, LocalSampler]]:
    yield from served(Saying)


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", timeout=60.0, max_retries=0)


def test_a_tool_call_comes_back_as_openai_tool_calls(calling: tuple[str, LocalSampler]) -> None:
    url, _ = calling
    done = client(url).chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, seed=4, max_tokens=64)
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will compute it."
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "calc"
    assert json.loads(call.function.arguments) == {"expression": "17 * 23"}
    # The same request gives the same call id, so a replayed conversation lines up with its record.
    again = client(url).chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, seed=4, max_tokens=64)
    assert (again.choices[0].message.tool_calls or [])[0].id == call.id
    # Sent back with its result, the call is rendered into the next prompt as the model wrote it.
    follow = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "391"},
    ]
    assert (
        client(url).chat.completions.create(model=MODEL, messages=follow, tools=TOOLS, max_tokens=8).choices
    )


def test_without_tools_or_with_a_malformed_call_the_reply_stays_text(
    calling: tuple[str, LocalSampler],
) -> None:
    url, _ = calling
    plain = client(url).chat.completions.create(model=MODEL, messages=ASK, max_tokens=64).choices[0]
    assert (
        plain.message.tool_calls is None
        and plain.finish_reason == "stop"
        and "<tool_call>" in str(plain.message.content)
    )
    refused = client(url).chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=64
    )
    assert refused.choices[0].message.tool_calls is None
    Saying.reply = '<tool_call>{"name": "calc", "arguments": [1]}</tool_call>'
    try:
        broken = (
            client(url)
            .chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=64)
            .choices[0]
        )
    finally:
        Saying.reply = "I will compute it. " + CALL
    assert (
        broken.message.tool_calls is None
        and broken.message.content == '<tool_call>{"name": "calc", "arguments": [1]}</tool_call>'
    )


def test_n_choices_are_distinct_and_reproducible(real: tuple[str, LocalSampler]) -> None:
    url, _ = real
    ask = {
        "model": MODEL,
        "messages": ASK,
        "n": 4,
        "seed": 11,
        "max_tokens": 12,
        "extra_body": {"return_token_ids": True},
    }
    first = client(url).chat.completions.create(**ask)  # type: ignore[call-overload]
    again = client(url).chat.completions.create(**ask)  # type: ignore[call-overload]
    tokens = [tuple(c.model_extra["token_ids"]) for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2, 3] and len(set(tokens)) == 4
    assert tokens == [tuple(c.model_extra["token_ids"]) for c in again.choices]
    assert first.usage is not None and first.usage.completion_tokens == sum(len(t) for t in tokens)


def test_stop_strings_cut_the_text_where_they_first_occur(real: tuple[str, LocalSampler]) -> None:
    url, _ = real
    ask = {"model": MODEL, "prompt": "17 * 23 =", "seed": 5, "max_tokens": 24, "temperature": 1.0}
    whole = client(url).completions.create(**ask).choices[0]  # type: ignore[call-overload]
    stop = whole.text[6:8]
    assert len(stop) == 2 and stop in whole.text
    cut = client(url).completions.create(**ask, stop=[stop]).choices[0]  # type: ignore[call-overload]
    assert cut.text == whole.text[: whole.text.find(stop)]
    assert cut.finish_reason == "stop" and cut.model_extra["stop_reason"] == stop


def test_a_body_over_the_cap_is_refused_before_parsing_while_small_requests_go_on(
    real: tuple[str, LocalSampler],
) -> None:
    url, _ = real
    before = httpx.get(url.removesuffix("/v1") + "/health").json()["requests"]
    answered: list[int] = []

    def small() -> None:
        answered.append(
            client(url)
            .completions.with_raw_response.create(model=MODEL, prompt=[1, 2], max_tokens=4)
            .status_code
        )

    beside = threading.Thread(target=small)
    beside.start()
    huge = json.dumps({"model": MODEL, "prompt": "x" * (10 << 20)}).encode()
    declared = httpx.post(
        f"{url}/completions", content=huge, headers={"content-type": "application/json"}, timeout=30
    )
    chunked = httpx.post(
        f"{url}/completions",
        content=iter([huge[i : i + 65536] for i in range(0, len(huge), 65536)]),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    beside.join(timeout=60)
    for refused in (declared, chunked):
        assert (
            refused.status_code == 413 and "larger than 1048576 bytes" in refused.json()["error"]["message"]
        )
    assert answered == [200]
    assert (
        httpx.get(url.removesuffix("/v1") + "/health").json()["requests"] == before + 1
    )  # only the small one sampled


def test_top_logprobs_come_from_the_distribution_drawn_from_and_change_no_token(
    real: tuple[str, LocalSampler],
) -> None:
    url, _ = real
    ask: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "seed": 2,
        "max_tokens": 10,
        "extra_body": {"return_token_ids": True, "return_tokens_as_token_ids": True},
    }
    plain = client(url).chat.completions.create(**ask).choices[0]
    rich = client(url).chat.completions.create(**ask, logprobs=True, top_logprobs=5).choices[0]
    assert rich.model_extra["token_ids"] == plain.model_extra["token_ids"]  # reporting changes no draw
    assert rich.logprobs is not None and rich.logprobs.content
    for entry in rich.logprobs.content:
        top = [t.logprob for t in entry.top_logprobs]
        assert len(top) == 5 and top == sorted(top, reverse=True) and entry.logprob <= top[0] + 1e-6
        listed = {t.token: t.logprob for t in entry.top_logprobs}
        if entry.token in listed:
            assert listed[entry.token] == pytest.approx(entry.logprob, abs=1e-6)
    greedy = client(url).chat.completions.create(**{**ask, "temperature": 0.0}, logprobs=True, top_logprobs=3)
    for entry in greedy.choices[0].logprobs.content:  # type: ignore[union-attr]
        assert entry.top_logprobs[0].token == entry.token


def test_a_stream_carries_the_same_reply_as_text_or_as_tool_call_deltas(
    real: tuple[str, LocalSampler], calling: tuple[str, LocalSampler]
) -> None:
    url, _ = real
    ask: dict[str, Any] = {"model": MODEL, "messages": ASK, "seed": 8, "max_tokens": 12}
    whole = client(url).chat.completions.create(**ask).choices[0]
    chunks = list(
        client(url).chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.finish_reason
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    streamed = "".join(
        c.choices[0].text
        for c in client(url).completions.create(model=MODEL, prompt="17 *", seed=1, max_tokens=8, stream=True)
    )
    assert (
        streamed
        == client(url).completions.create(model=MODEL, prompt="17 *", seed=1, max_tokens=8).choices[0].text
    )

    url, _ = calling
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client(url).chat.completions.create(**ask, tools=TOOLS, stream=True):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            got = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            got["id"] += delta.id or ""
            got["name"] += (delta.function.name if delta.function else None) or ""
            got["arguments"] += (delta.function.arguments if delta.function else None) or ""
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == "calc" and json.loads(calls[0]["arguments"]) == {"expression": "17 * 23"}


def test_the_responses_api_answers_text_and_function_call_items(
    real: tuple[str, LocalSampler], calling: tuple[str, LocalSampler]
) -> None:
    url, _ = real
    text = client(url).responses.create(
        model=MODEL,
        input="What is 17 * 23?",
        instructions="Be brief.",
        max_output_tokens=8,
        extra_body={"seed": 3},
    )
    chat = client(url).chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "Be brief."}, *ASK], max_tokens=8, seed=3
    )
    assert text.output_text == chat.choices[0].message.content  # the same sample, another shape
    assert text.usage is not None and text.usage.output_tokens == chat.usage.completion_tokens  # type: ignore[union-attr]
    assert text.status in ("completed", "incomplete")

    url, _ = calling
    tools = [
        {
            "type": "function",
            "name": "calc",
            "description": "Evaluate.",
            "parameters": TOOLS[0]["function"]["parameters"],
        }
    ]
    asked = client(url).responses.create(model=MODEL, input=ASK, tools=tools, extra_body={"seed": 4})  # type: ignore[arg-type]
    (call,) = [item for item in asked.output if item.type == "function_call"]
    assert call.name == "calc" and json.loads(call.arguments) == {"expression": "17 * 23"}
    follow = [
        *ASK,
        {"type": "function_call", "call_id": call.call_id, "name": "calc", "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "391"},
    ]
    assert client(url).responses.create(model=MODEL, input=follow, tools=tools, max_output_tokens=8).output  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="input_image"):
        client(url).responses.create(
            model=MODEL, input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]
        )  # type: ignore[list-item]


@pytest.mark.parametrize("provider", ["openai-api", "openai"])
def test_inspect_ai_runs_an_eval_against_the_policy_server(
    real: tuple[str, LocalSampler], provider: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample as InspectSample
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate

    url, _ = real
    monkeypatch.setenv("REPRORL_API_KEY", "unused")
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    # Inspect's openai/ provider speaks the Responses API; openai-api/ speaks chat completions.
    model, args = (
        (f"openai-api/reprorl/{MODEL}", {})
        if provider == "openai-api"
        else (f"openai/{MODEL}", {"responses_api": True})
    )
    task = Task(
        dataset=[InspectSample(input="What is 2+2?", target="4")], solver=generate(), scorer=includes()
    )
    (log,) = inspect_eval(
        task,
        model=model,
        model_base_url=url,
        model_args=args,
        log_dir=str(tmp_path),
        display="none",
        max_tokens=16,
    )
    assert log.status == "success", log.error
    assert log.samples and log.samples[0].output.completion and log.samples[0].output.usage is not None


def test_the_probe_sees_logprobs_after_temperature_from_the_policy_server(
    real: tuple[str, LocalSampler],
) -> None:
    url, _ = real
    with HttpSampler(url, MODEL) as sampler:
        assert "logprobs" not in sampler.info()  # not yet known, so not recorded
        assert sampler.probe_logprobs() == "processed"
        assert sampler.info()["logprobs"] == "processed"
