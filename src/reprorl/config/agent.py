"""The agent program a run trains through the proxy: a command or a Python callable, and its limits."""

from __future__ import annotations

import re
from typing import Self

from pydantic import Field, model_validator

from reprorl.config.base import Owner, SpecModel

GIB = 1 << 30
CALLABLE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")


class AgentSpec(SpecModel):
    """Who acts in each episode instead of reprorl's own tool loop: the run starts an OpenAI-compatible
    proxy on 127.0.0.1 and launches the agent once per rollout in that rollout's sandbox (in the
    episode's files, under the sandbox's uid and limits), pointed at
    `http://127.0.0.1:<port>/r/<rollout_id>/v1` with a key of its own. Every request is sampled from
    the policy being trained with the run's sampling settings (an agent's own temperature, max_tokens
    or stop are not applied); the task's verifier scores the agent's last reply and the files it left.
    See docs/agents.md."""

    owner: Owner
    callable: str | None = Field(
        default=None,
        description="'module:function' called in the sandbox as function(base_url=..., api_key=..., "
        "model=..., task=...) with the task's messages and tool schemas as a dict; what it returns is "
        "recorded. The module is imported once, before any episode, so a broken import fails the run "
        "at the start.",
    )
    command: tuple[str, ...] | None = Field(
        default=None,
        min_length=1,
        description="Argument vector run in the sandbox (no shell), with OPENAI_BASE_URL, "
        "OPENAI_API_KEY, REPRORL_MODEL and REPRORL_TASK (the task as JSON) in its environment ('{python}' "
        "stands for reprorl's interpreter); a "
        "non-zero exit is the agent's failure.",
    )
    path: tuple[str, ...] = Field(
        default=(),
        description="Folders put on the import path to find the callable's module; the module's source "
        "is hashed into every rollout's record.",
    )
    cpu_s: int = Field(
        default=120, ge=1, le=86_400, description="CPU seconds the agent's sandbox process may use."
    )
    memory_bytes: int = Field(
        default=4 * GIB,
        ge=256 << 20,
        description="Address space the agent's process may map (RLIMIT_AS); Python agent frameworks map "
        "far more than they use.",
    )
    output_chars: int = Field(
        default=4000,
        ge=0,
        le=1 << 18,
        description="Characters kept of the agent's stdout, of its stderr and of what it returns.",
    )

    @model_validator(mode="after")
    def _one_program(self) -> Self:
        if (self.callable is None) == (self.command is None):
            raise ValueError("give exactly one of agent.callable ('module:function') or agent.command")
        if self.callable is not None and not CALLABLE.match(self.callable):
            raise ValueError(f"agent.callable {self.callable!r} is not 'module:function'")
        return self
