"""Streamed answers (`stream: true`): a finished completion sent as OpenAI's server-sent event chunks.

The sampler decodes a batch to the end before any row is returned, so the stream carries the
reply once it is complete; it is the shape a streaming client reads (role, then content or
tool-call deltas, then the finish reason, then `usage` when `stream_options.include_usage` asks,
then `data: [DONE]`), not an earlier first token. Each chunk repeats the completion's id, model
and `system_fingerprint` (the policy version), as OpenAI's do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

DONE = "data: [DONE]\n\n"


def sse(chunks: Iterator[Mapping[str, Any]]) -> Iterator[str]:
    """Each chunk as one `data:` event, then the terminating `[DONE]`."""
    for chunk in chunks:
        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    yield DONE


def _head(done: Mapping[str, Any], kind: str) -> dict[str, Any]:
    return {
        "id": done["id"],
        "object": kind,
        "created": done["created"],
        "model": done["model"],
        "system_fingerprint": done.get("system_fingerprint"),
    }


def chat_chunks(done: Mapping[str, Any], *, include_usage: bool) -> Iterator[dict[str, Any]]:
    """A `chat.completion` as `chat.completion.chunk`s: per choice its role, content, calls, finish."""
    head = _head(done, "chat.completion.chunk")
    for choice in done["choices"]:
        index, message = choice["index"], choice["message"]

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
            return {**head, "choices": [{"index": index, "delta": delta, "finish_reason": finish, **extra}]}  # noqa: B023

        yield chunk({"role": "assistant", "content": ""})
        if message.get("content"):
            yield chunk({"content": message["content"]}, logprobs=choice.get("logprobs"))
        for position, call in enumerate(message.get("tool_calls") or []):
            function = call["function"]
            opening = {
                "id": call["id"],
                "type": "function",
                "function": {"name": function["name"], "arguments": ""},
            }
            yield chunk({"tool_calls": [{"index": position, **opening}]})
            yield chunk(
                {"tool_calls": [{"index": position, "function": {"arguments": function["arguments"]}}]}
            )
        yield chunk({}, choice["finish_reason"], stop_reason=choice.get("stop_reason"))
    if include_usage:
        yield {**head, "choices": [], "usage": done["usage"]}


def completion_chunks(done: Mapping[str, Any], *, include_usage: bool) -> Iterator[dict[str, Any]]:
    """A `text_completion` as chunks of the same object: per choice its text, then its finish."""
    head = _head(done, "text_completion")
    for choice in done["choices"]:
        index = choice["index"]
        yield {
            **head,
            "choices": [
                {
                    "index": index,
                    "text": choice["text"],
                    "logprobs": choice.get("logprobs"),
                    "finish_reason": None,
                }
            ],
        }
        yield {
            **head,
            "choices": [
                {
                    "index": index,
                    "text": "",
                    "logprobs": None,
                    "finish_reason": choice["finish_reason"],
                    "stop_reason": choice.get("stop_reason"),
                }
            ],
        }
    if include_usage:
        yield {**head, "choices": [], "usage": done["usage"]}
