"""An agent written with the OpenAI Agents SDK (`openai-agents`): its own runner, its own tool."""

from __future__ import annotations

from typing import Any

from calc_tools import calculate
from openai import AsyncOpenAI

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

set_tracing_disabled(True)  # the SDK would otherwise send traces to OpenAI


@function_tool
def calc(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return calculate(expression)


def _run(task: dict[str, Any], model: Any) -> str:
    system = "\n".join(m["content"] for m in task["messages"] if m["role"] == "system")
    question = "\n".join(m["content"] for m in task["messages"] if m["role"] == "user")
    calculator = Agent(name="calculator", instructions=system or None, model=model, tools=[calc])
    return str(Runner.run_sync(calculator, question, max_turns=8).final_output)


def agent(*, base_url: str, api_key: str, model: str, task: dict[str, Any]) -> str:
    """Through chat completions."""
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    return _run(task, OpenAIChatCompletionsModel(model=model, openai_client=client))


def responses_agent(*, base_url: str, api_key: str, model: str, task: dict[str, Any]) -> str:
    """Through the Responses API (the SDK's default for OpenAI models)."""
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    return _run(task, OpenAIResponsesModel(model=model, openai_client=client))
