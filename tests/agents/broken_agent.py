"""Agents that fail: one raises after a turn, one sleeps past its episode's wall clock."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from openai import OpenAI


def agent(*, base_url: str, api_key: str, model: str, task: dict[str, Any]) -> str:
    OpenAI(base_url=base_url, api_key=api_key, max_retries=0).chat.completions.create(
        model=model, messages=task["messages"]
    )
    raise RuntimeError("the agent gave up")


def sleeper(*, base_url: str, api_key: str, model: str, task: dict[str, Any]) -> str:
    subprocess.Popen(["sleep", "600"])  # what it started dies with it
    time.sleep(600)
    return "never"
