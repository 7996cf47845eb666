"""An agent written with the official `openai` SDK: a plain tool loop, nothing of reprorl imported."""

from __future__ import annotations

import json
from typing import Any

from calc_tools import CALC, calculate
from openai import OpenAI


def agent(*, base_url: str, api_key: str, model: str, task: dict[str, Any]) -> str:
    """Answer the task, calling `calc` as the model asks; returns every reply's content, as JSON."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    messages: list[dict[str, Any]] = list(task["messages"])
    seen: list[Any] = []
    for _ in range(8):
        reply = client.chat.completions.create(model=model, messages=messages, tools=[CALC])  # type: ignore[arg-type]
        message = reply.choices[0].message
        seen.append(
            {"content": message.content, "calls": [c.function.arguments for c in message.tool_calls or []]}
        )
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            result = (
                calculate(arguments.get("expression", "")) if call.function.name == "calc" else "no such tool"
            )
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return json.dumps(seen)


def picky(*, base_url: str, api_key: str, model: str, task: dict[str, Any]) -> str:
    """Asks for two choices under a stop string and goes on from the second, then answers."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    messages: list[dict[str, Any]] = list(task["messages"])
    first = client.chat.completions.create(model=model, messages=messages, tools=[CALC], n=2, stop=["7"])  # type: ignore[arg-type]
    taken = first.choices[1].message
    messages.append(taken.model_dump(exclude_none=True))
    for call in taken.tool_calls or []:
        arguments = json.loads(call.function.arguments)
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": calculate(arguments.get("expression", ""))}
        )
    if not taken.tool_calls:
        messages.append({"role": "user", "content": "Check it and answer again."})
    last = client.chat.completions.create(model=model, messages=messages, tools=[CALC])  # type: ignore[arg-type]
    return json.dumps([{"content": m.content} for m in (taken, last.choices[0].message)])
