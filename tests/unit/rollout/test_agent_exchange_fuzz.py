"""The proxy's tool-call path under fuzz: 10,000 model outputs sampled through an agent's exchange,
each returned as a valid chat completion and recorded as a classified turn, none raising."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from fuzzed_outputs import model_outputs
from reprorl.actions import OPEN, parse_action
from reprorl.openai_api.schemas import ChatBody, ChatMessageBody
from reprorl.policy import tiny_model
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import Sample, SampleRequest
from reprorl.rollout.agents import Exchange, ExchangeLimits
from reprorl.types import SamplingParams, ToolOutcome

TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


def test_ten_thousand_fuzzed_outputs_through_the_exchange_each_classified() -> None:
    renderer = ChatRenderer(tiny_model(0).tokenizer)
    outputs = model_outputs(10_000, seed=987)
    kinds: Counter[str] = Counter()

    async def go() -> None:
        for n, text in enumerate(outputs):

            async def submit(request: SampleRequest, text: str = text) -> tuple[Sample, float]:
                return Sample(request.key, (5, 6), (-0.1, -0.2), "stop", text, (request.key,), "v"), 0.0

            exchange = Exchange(
                rollout_id=f"fuzz/{n}",
                key="k",
                renderer=renderer,
                submit=submit,
                params=SamplingParams(),
                seed_of=lambda turn, n=n: n,
                limits=ExchangeLimits(max_turns=2, max_tokens=1000),
            )
            body = ChatBody.model_validate({"messages": [{"role": "user", "content": "go"}], "tools": TOOLS})
            done = await exchange.chat(body)
            wire = json.loads(json.dumps(done, allow_nan=False))  # what the agent receives
            message = ChatMessageBody.model_validate(wire["choices"][0]["message"])
            (turn,) = exchange.turns
            action = parse_action(text)
            if turn.tool_calls:
                kinds["tool_calls"] += 1
                assert wire["choices"][0]["finish_reason"] == "tool_calls" and not action.parse_errors
                assert [
                    (c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []
                ] == [(c.name, c.arguments) for c in action.tool_calls]
                assert turn.finish_reason == "tool_call" and not turn.tool_results
            elif OPEN in text and action.parse_errors:
                kinds["parse_error"] += 1
                # The model's broken call stays text for the agent and is the model's error in the record.
                assert message.content == text and wire["choices"][0]["finish_reason"] == "stop"
                assert [r.outcome for r in turn.tool_results] == [ToolOutcome.PARSE_ERROR] * len(
                    action.parse_errors
                )
            else:
                kinds["text"] += 1
                assert message.content == text and not turn.tool_results and exchange.answer == text
            assert turn.text == text and turn.token_ids == (5, 6)
            turn.model_dump_json()  # the record serialises

    asyncio.run(go())
    assert kinds["tool_calls"] > 500 and kinds["parse_error"] > 500 and kinds["text"] > 3000, kinds
