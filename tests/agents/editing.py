"""An agent that edits its own history: after the first reply it drops that reply and asks again."""

from __future__ import annotations

from typing import Any

from openai import OpenAI


def agent(*, base_url: str, api_key: str, model: str, task: dict[str, Any]) -> str:
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    messages: list[dict[str, Any]] = list(task["messages"])
    first = client.chat.completions.create(model=model, messages=messages)
    # A summarising agent rewrites what it was told: the model's reply is replaced by a note.
    said = len(first.choices[0].message.content or "")
    messages += [
        {"role": "assistant", "content": "(earlier answer elided)"},
        {
            "role": "user",
            "content": f"Check your answer; you said {said} characters.",
        },
    ]
    second = client.chat.completions.create(model=model, messages=messages)
    return second.choices[0].message.content or ""
