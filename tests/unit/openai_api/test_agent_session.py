"""The agent proxy's token history: a request that extends what the agent was told is continued
token-in/token-out; one that departs from it is rendered afresh and recorded as diverged."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reprorl.actions import render_call
from reprorl.openai_api.agent_session import AgentSession
from reprorl.openai_api.openai_format import chat_message, request_message, structured
from reprorl.openai_api.schemas import ChatMessageBody
from reprorl.policy import tiny_model
from reprorl.policy.chat import ChatRenderer

TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
ASK = {"role": "user", "content": "What is 17 * 23?"}


def bodies(messages: list[dict[str, Any]]) -> list[ChatMessageBody]:
    return [ChatMessageBody.model_validate(m) for m in messages]


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(tiny_model(0).tokenizer)


def first_turn(renderer: ChatRenderer) -> tuple[AgentSession, dict[str, Any], list[int]]:
    """A session after one exchange in which the policy called calc; returns the reply the agent got."""
    session = AgentSession("run/r0", renderer)
    prompt = session.prompt(bodies([ASK]), TOOLS)
    assert prompt.context == "first" and list(prompt.token_ids) == renderer.prompt_ids(
        [request_message(m) for m in bodies([ASK])], TOOLS
    )
    sampled = renderer.encode("Let me see. " + render_call("calc", {"expression": "17 * 23"}))
    reply = chat_message(structured(renderer.decode(sampled), "stop", None, tools=True, seed=1, choice=0))
    session.record(bodies([ASK]), TOOLS, prompt, sampled, reply)
    return session, reply, [*prompt.token_ids, *sampled]


def test_a_request_that_extends_the_history_appends_only_the_new_tokens(renderer: ChatRenderer) -> None:
    session, reply, context = first_turn(renderer)
    # The SDK sends the reply back re-serialised: other spacing in the arguments, content as parts.
    call = reply["tool_calls"][0]
    echoed = {
        **reply,
        "content": [{"type": "text", "text": reply["content"]}],
        "tool_calls": [
            {
                **call,
                "function": {
                    **call["function"],
                    "arguments": json.dumps(json.loads(call["function"]["arguments"]), indent=2),
                },
            }
        ],
    }
    result = {"role": "tool", "tool_call_id": call["id"], "content": "391"}
    prompt = session.prompt(bodies([ASK, echoed, result]), TOOLS)
    assert prompt.context == "continued" and prompt.diverged_at is None
    assert list(prompt.token_ids[: len(context)]) == context  # the sampled tokens, never re-tokenised
    assert list(prompt.appended) == renderer.observation_ids(
        context[-5:], [request_message(m) for m in bodies([result])]
    )
    again = session.prompt(bodies([ASK, echoed, result]), TOOLS)
    assert again.token_ids == prompt.token_ids  # deterministic
    assert session.divergences == 0


@pytest.mark.parametrize(
    ("edit", "at"),
    [
        (lambda reply, result: [{"role": "user", "content": "What is 17 * 24?"}, reply, result], 0),
        (lambda reply, result: [ASK, result], 1),  # dropped the model's turn
        (lambda reply, result: [ASK, {**reply, "content": "I know it."}, result], 1),  # edited it
        (lambda reply, result: [ASK, reply, {"role": "assistant", "content": "391"}], 2),  # spoke for it
    ],
)
def test_an_edited_history_is_rendered_afresh_and_recorded_as_diverged(
    renderer: ChatRenderer, edit: Any, at: int
) -> None:
    session, reply, _ = first_turn(renderer)
    result = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "391"}
    messages = bodies(edit(reply, result))
    prompt = session.prompt(messages, TOOLS)
    assert (prompt.context, prompt.diverged_at) == ("diverged", at)
    assert list(prompt.token_ids) == renderer.prompt_ids([request_message(m) for m in messages], TOOLS)
    assert session.divergences == 1


def test_changed_tools_diverge_and_a_retry_resamples_the_same_context(renderer: ChatRenderer) -> None:
    session, reply, context = first_turn(renderer)
    result = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "391"}
    other_tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    assert session.prompt(bodies([ASK, reply, result]), other_tools).diverged_at == 0
    retry = session.prompt(bodies([ASK, reply]), TOOLS)
    assert retry.context == "repeated" and list(retry.token_ids) == context[: len(retry.token_ids)]
    assert len(retry.token_ids) == len(
        renderer.prompt_ids([request_message(m) for m in bodies([ASK])], TOOLS)
    )
