"""An agent as a plain program: standard library only, the proxy's address and the task from its environment.

Any language would do; this one speaks the chat completions API with urllib, and runs the
calculator tool itself, as the `openai` SDK loop does.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calc_tools import CALC, calculate


def ask(messages: list[dict[str, object]]) -> dict[str, object]:
    body = json.dumps({"model": os.environ["REPRORL_MODEL"], "messages": messages, "tools": [CALC]}).encode()
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=body,
        headers={
            "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["choices"][0]["message"]  # type: ignore[no-any-return]


def main() -> None:
    messages = list(json.loads(os.environ["REPRORL_TASK"])["messages"])
    for _ in range(8):
        message = ask(messages)
        calls = message.get("tool_calls") or []
        if not calls:
            print(message.get("content") or "")
            return
        messages.append(message)
        for call in calls:  # type: ignore[attr-defined]
            arguments = json.loads(call["function"]["arguments"])
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": calculate(arguments["expression"])}
            )


if __name__ == "__main__":
    main()
