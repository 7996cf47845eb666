"""The served tool-call path under fuzz: every model output becomes a valid OpenAI message, classified
as text or as parsed calls, and what a client sends back of it reads as the same calls."""

from __future__ import annotations

import json

from fuzzed_outputs import model_outputs
from reprorl.actions import parse_action
from reprorl.openai_api.openai_format import chat_message, request_message, structured
from reprorl.openai_api.schemas import ChatMessageBody


def test_ten_thousand_fuzzed_outputs_become_valid_messages_each_classified() -> None:
    kinds = {"text": 0, "tool_calls": 0}
    for n, text in enumerate(model_outputs(10_000, seed=4321)):
        reply = structured(text, "stop", None, tools=True, seed=n, choice=0)
        message = chat_message(reply)
        wire = json.loads(json.dumps(message, allow_nan=False))  # what a client receives
        action = parse_action(text)
        if reply.tool_calls:
            kinds["tool_calls"] += 1
            # Only a reply whose every call parsed is structured, and its calls are the parsed ones.
            assert not action.parse_errors and reply.finish_reason == "tool_calls"
            sent = [
                (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in wire["tool_calls"]
            ]
            assert sent == [(c.name, c.arguments) for c in action.tool_calls]
            assert len({c["id"] for c in wire["tool_calls"]}) == len(sent)
        else:
            kinds["text"] += 1
            assert wire["content"] == text and "tool_calls" not in wire and reply.finish_reason == "stop"
        # Sent back by the agent, the message reads as the same calls (or the same text).
        echoed = request_message(ChatMessageBody.model_validate(wire))
        assert [(c.name, c.arguments) for c in parse_action(echoed.content).tool_calls] == [
            (c.name, c.arguments) for c in reply.tool_calls or action.tool_calls
        ]
    assert kinds["tool_calls"] > 500 and kinds["text"] > 5000
