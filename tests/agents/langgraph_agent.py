"""An agent written with LangGraph and `langchain-openai`: a prebuilt ReAct graph over a local tool."""

from __future__ import annotations

from typing import Any

from calc_tools import calculate
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent


@tool
def calc(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return calculate(expression)


def agent(*, base_url: str, api_key: str, model: str, task: dict[str, Any]) -> str:
    llm = ChatOpenAI(model=model, base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    graph = create_react_agent(llm, [calc])
    state = graph.invoke({"messages": task["messages"]}, {"recursion_limit": 16})
    return str(state["messages"][-1].content)
