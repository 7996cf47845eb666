"""OpenAI's shapes for what a policy sampled: tool calls as `tool_calls`, stop strings cut, and their reasons.

The model writes its calls as `<tool_call>` text (`reprorl.actions`); an OpenAI client wants them
structured, with `finish_reason = "tool_calls"`, or an agent framework takes the tagged text for a
final answer. A reply whose calls do not all parse stays text (as OpenAI-compatible servers leave
what their tool parser cannot read): the agent sees what the model wrote, and the record keeps the
parse error as the model's. Call ids are derived from the request's seed, so the same request
gives the same ids and a replayed conversation lines up with its record.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reprorl.actions import CLOSE, OPEN, parse_action
from reprorl.openai_api.api_errors import ApiError
from reprorl.openai_api.schemas import ChatMessageBody
from reprorl.policy.http import tool_call_text
from reprorl.types import Message, ToolCall


@dataclass(frozen=True)
class Reply:
    """One sampled reply as a chat client sees it."""

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str  # OpenAI's: "stop", "length" or "tool_calls"
    stop_reason: str | int | None  # vLLM's: the stop string or token that ended the reply


def call_id(seed: int, choice: int, index: int) -> str:
    """A tool call's id: the same for the same request (seed), distinct per choice and call."""
    return f"call_{seed:016x}_{choice}_{index}"


def structured(
    text: str, finish: str, stop_reason: str | int | None, *, tools: bool, seed: int, choice: int
) -> Reply:
    """The reply with its calls parsed out when the request offered tools and every call parses."""
    if not tools or OPEN not in text:
        return Reply(text, (), finish, stop_reason)
    action = parse_action(text)
    if action.parse_errors or not action.tool_calls:
        return Reply(text, (), finish, stop_reason)
    calls = tuple(
        call.model_copy(update={"id": call_id(seed, choice, i)}) for i, call in enumerate(action.tool_calls)
    )
    before = text.split(OPEN, 1)[0].strip()
    return Reply(before or None, calls, "tool_calls", CLOSE)


def chat_message(reply: Reply) -> dict[str, Any]:
    """`choices[i].message` of a chat completion."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
            }
            for call in reply.tool_calls
        ]
    return message


@dataclass(frozen=True)
class Cut:
    """Where a stop string ended a reply: the text before it, and how many sampled tokens reach it."""

    text: str
    tokens: int
    stop: str


def cut_at_stop(pieces: Sequence[str], stops: Sequence[str]) -> Cut | None:
    """The earliest stop string in the decoded tokens, or None.

    The text is cut before the stop string (OpenAI's convention); the tokens are kept up to and
    including the one that completed it, so the ids still decode to a prefix of what was sampled.
    """
    if not stops:
        return None
    text = "".join(pieces)
    found = [(at, stop) for stop in stops if stop and (at := text.find(stop)) != -1]
    if not found:
        return None
    at, stop = min(found)
    end, length = at + len(stop), 0
    for count, piece in enumerate(pieces, 1):
        length += len(piece)
        if length >= end:
            return Cut(text[:at], count, stop)
    return Cut(text[:at], len(pieces), stop)


def token_bytes(piece: str) -> list[int] | None:
    # A piece that ends inside a UTF-8 character decodes to U+FFFD, not its bytes.
    return None if "\ufffd" in piece else list(piece.encode("utf-8"))


def top_entry(token: str, logprob: float, text: str) -> dict[str, Any]:
    """One of `top_logprobs`: the token as the request asked it named, its logprob, its text's bytes."""
    return {"token": token, "logprob": logprob, "bytes": token_bytes(text)}


TopStep = Sequence[tuple[int, str, float]]  # per sampled token: (token id, its text, logprob), best first


def logprob_content(
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    pieces: Sequence[str],
    top: Sequence[TopStep],
    *,
    as_ids: bool,
    id_prefix: str,
) -> list[dict[str, Any]]:
    """`choices[i].logprobs.content` of a chat completion: each sampled token, its logprob and the
    most likely alternatives; `as_ids` names tokens `<id_prefix><id>` (vLLM's return_tokens_as_token_ids)."""
    return [
        {
            "token": f"{id_prefix}{t}" if as_ids else piece,
            "logprob": lp,
            "bytes": token_bytes(piece),
            "top_logprobs": [
                top_entry(f"{id_prefix}{i}" if as_ids else text, value, text) for i, text, value in step
            ],
        }
        for t, lp, piece, step in zip(token_ids, logprobs, pieces, top or [()] * len(token_ids), strict=True)
    ]


def request_message(body: ChatMessageBody) -> Message:
    """An OpenAI chat message as a reprorl message; structured tool calls become `<tool_call>` text."""
    if isinstance(body.content, list):
        texts = []
        for part in body.content:
            if part.type != "text" or part.text is None:
                raise ApiError(
                    400, f"content parts of type {part.type!r} are not supported", param="messages"
                )
            texts.append(part.text)
        content = "".join(texts)
    else:
        content = body.content or ""
    for call in body.tool_calls or []:
        content += tool_call_text(call.function.name, call.function.arguments)
    return Message(role=body.role, content=content, tool_call_id=body.tool_call_id, name=body.name)
