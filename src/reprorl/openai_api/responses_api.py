"""OpenAI's Responses API (`POST /v1/responses`), basic text and function-call items, over the chat path.

A request's `input` (a string, or items: messages with text parts, `function_call` and
`function_call_output`) and `instructions` become the chat conversation the policy is sampled on,
so a reply is sampled exactly as a chat request would be (same renderer, seeds and tool-call
reading); the chat completion is then answered as a `response` object whose `output` holds a
`message` item with `output_text` and one `function_call` item per call. Items the policy cannot
take (images, files, reasoning, built-in tools) are refused with a 400 naming the item.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationError

from reprorl.openai_api.api_errors import ApiError
from reprorl.openai_api.schemas import ChatBody, Lenient

TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesBody(Lenient):
    """`POST /v1/responses`: the fields this server honours."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0)
    stream: bool = False


def _text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or a list of text parts", param="input")
    texts = []
    for n, part in enumerate(content):
        if (
            not isinstance(part, dict)
            or part.get("type") not in TEXT_PARTS
            or not isinstance(part.get("text"), str)
        ):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ApiError(
                400, f"{where}.content[{n}] of type {kind!r} is not supported; send text", param="input"
            )
        texts.append(part["text"])
    return "".join(texts)


def chat_messages(body: ResponsesBody) -> list[dict[str, Any]]:
    """The request as chat messages: instructions first, then each input item in order."""
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        return [*messages, {"role": "user", "content": body.input}]
    for n, item in enumerate(body.input):
        where = f"input[{n}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ApiError(
                    400,
                    f"{where}.role {role!r} is not one of user, assistant, system, developer",
                    param="input",
                )
            messages.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": _text(item.get("content"), where),
                }
            )
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # consecutive calls are one assistant turn
            elif last is not None and last["role"] == "assistant" and not last.get("tool_calls"):
                last["tool_calls"] = [call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": _text(output, where)}
            )
        else:
            raise ApiError(400, f"{where} of type {kind!r} is not supported", param="input")
    return messages


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The Responses API's flat function tools in the chat API's nested shape."""
    if not tools:
        return None
    out = []
    for n, tool in enumerate(tools):
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise ApiError(
                400,
                f"tools[{n}] of type {tool.get('type')!r} is not supported; send functions",
                param="tools",
            )
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": function})
    return out


def as_chat(body: ResponsesBody) -> ChatBody:
    if body.stream:
        raise ApiError(400, "streaming is not supported on /v1/responses; send stream=false", param="stream")
    try:
        return _chat(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ApiError(400, f"{where}: {first.get('msg', 'invalid')}", param="input") from None


def _chat(body: ResponsesBody) -> ChatBody:
    return ChatBody.model_validate(
        {
            "model": body.model,
            "messages": chat_messages(body),
            "tools": chat_tools(body.tools),
            "tool_choice": body.tool_choice,
            "max_tokens": body.max_output_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "seed": body.seed,
        }
    )


def as_response(done: Mapping[str, Any]) -> dict[str, Any]:
    """A chat completion as a `response` object."""
    choice = done["choices"][0]
    message = choice["message"]
    suffix = done["id"].removeprefix("chatcmpl-")
    output: list[dict[str, Any]] = []
    if message.get("content"):
        text = {"type": "output_text", "text": message["content"], "annotations": []}
        output.append(
            {
                "type": "message",
                "id": f"msg_{suffix}",
                "status": "completed",
                "role": "assistant",
                "content": [text],
            }
        )
    for call in message.get("tool_calls") or []:
        function = call["function"]
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{call['id']}",
                "call_id": call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
                "status": "completed",
            }
        )
    usage = done["usage"]
    cut = choice["finish_reason"] == "length"
    return {
        "id": f"resp_{suffix}",
        "object": "response",
        "created_at": done.get("created", int(time.time())),
        "model": done["model"],
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
        "reprorl": done.get("reprorl"),
    }
