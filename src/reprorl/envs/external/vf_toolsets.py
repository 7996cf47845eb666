"""A verifiers v1 taskset's toolsets, run as local code in the episode's sandbox.

A verifiers `Toolset` is a class whose `@vf.tool` methods verifiers serves over MCP, beside a
rollout-wide `State` that every toolset and the task's rewards share through a state channel.
reprorl runs them where its own tools run: `start` (the env's setup) builds the task's and the
taskset's toolsets inside the sandbox process, runs their `setup` (and, for the task's, their
`setup_task` with the task), and registers each on an in-process `MCPServer`; `call_tool` calls one
through that server (MCP's own argument validation and result conversion, no transport), and the
channel is a cell in the sandbox process, so state persists across the episode's calls and dies with
its sandbox. `state` returns the channel's JSON, which the env keeps as the episode's state for the
rewards. The sandbox confines the toolsets as it confines any tool: no network, the episode's files
only. As in verifiers, a toolset sees the whole task, its hidden data included; the agent reaches
it only through the toolset's tools. One sandbox per episode, so a taskset-wide toolset is built
per episode here (verifiers shares one per worker): no state leaks between episodes.

`listed` (run on the host when the family is made) gives one reprorl `Tool` per MCP tool, named as
verifiers names it (`<server>_<tool>`), with its input schema from `tools/list`.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from dataclasses import dataclass
from typing import Any

from reprorl.envs.outside import run_on_own_loop
from reprorl.envs.tool import Tool
from reprorl.errors import UserInputError
from reprorl.hashing import code_fingerprint, content_hash
from reprorl.types import Permission
from reprorl.verifiers_v1 import load_taskset, task_of

MODULE = "reprorl.envs.external.vf_toolsets"


@dataclass
class _Served:
    """One toolset on its in-process MCP server."""

    toolset: Any
    mcp: Any


class _Episode:
    """The sandbox's toolsets, their shared state channel, and the loop they run on."""

    def __init__(self, task: Any, toolsets: list[tuple[Any, bool]]) -> None:
        from mcp.server.mcpserver import MCPServer
        from verifiers.v1.state import state_cls

        self.loop = asyncio.new_event_loop()
        self.state_type = state_cls(type(task))
        self.state_json = self.state_type().model_dump_json()
        self.servers: dict[str, _Served] = {}
        for toolset, task_scoped in toolsets:
            self._channel(toolset)
            self.loop.run_until_complete(toolset.setup())
            if task_scoped:
                self.loop.run_until_complete(toolset.setup_task(task))
            mcp = MCPServer(toolset.server_name or type(toolset).__name__)
            toolset.register(mcp)
            self.servers[toolset.server_name] = _Served(toolset, mcp)

    def _channel(self, toolset: Any) -> None:
        """The toolset's state pull and push, on this process's cell instead of an HTTP channel."""

        async def pull() -> Any:
            return toolset._state_adapter.validate_json(self.state_json)

        async def push(before: bytes) -> None:
            after = toolset._state_adapter.dump_json(toolset.state)
            if after != before:  # validated as the rollout's state, as verifiers' host does
                self.state_json = self.state_type.model_validate_json(after).model_dump_json()

        toolset._pull_state, toolset._push_state = pull, push


_EPISODE: _Episode | None = None


def _toolsets(loaded: Any, task_type: Any) -> list[tuple[Any, bool]]:
    """The task's toolsets (per task: `setup_task` runs) and then the taskset's."""
    task_config = loaded.config.task
    found = [(t, True) for t in task_type.toolsets(task_config)]
    found += [(t, False) for t in type(loaded).toolsets(loaded.config)]
    for toolset, _ in found:
        if getattr(toolset.config, "url", None):
            raise UserInputError(
                f"the toolset {type(toolset).__name__} is given by URL; reprorl runs a taskset's "
                "toolsets as local code in its sandbox (serve it as an MCP server and use mcp_tools)"
            )
    return found


# -- in the sandbox --------------------------------------------------------------------------------


def start(ctx: Any, *, setup: dict[str, Any]) -> str:
    """Build the episode's toolsets for the task whose data `setup` carries."""
    global _EPISODE
    loaded = load_taskset(setup["taskset"], setup["config"])
    task = task_of(loaded, setup["data"])
    if task.hash != setup["hash"]:
        raise ValueError(f"the task's data no longer hashes to {setup['hash']}")
    _EPISODE = _Episode(task, _toolsets(loaded, type(task)))
    return ""


def call_tool(ctx: Any, *, server: str, tool: str, arguments: dict[str, Any]) -> str:
    """One tool's call: its text, or its error raised (the tool's failure, classified by the env)."""
    if _EPISODE is None:
        raise RuntimeError("the episode's toolsets were not started")
    served = _EPISODE.servers[server]
    result = _EPISODE.loop.run_until_complete(served.mcp.call_tool(tool, arguments))
    text = "\n".join(
        block.text if getattr(block, "type", "") == "text" else f"[{block.type} content]"
        for block in getattr(result, "content", ())
    )
    if getattr(result, "is_error", False):
        raise RuntimeError(text or "the tool reported an error")
    return text


def state(ctx: Any) -> str:
    """The rollout's shared state, as JSON."""
    return _EPISODE.state_json if _EPISODE is not None else ""


# -- on the host -----------------------------------------------------------------------------------


def listed(taskset: str, config: dict[str, Any], *, timeout_s: float) -> tuple[tuple[Tool, ...], bool]:
    """The taskset's toolsets' tools, and whether the rollout's state is more than verifiers' base."""
    from mcp.server.mcpserver import MCPServer
    from verifiers.v1.state import State, state_cls

    loaded = load_taskset(taskset, config)
    task_type = type(loaded).task_type()
    version = importlib.metadata.version("verifiers")
    tools: list[Tool] = []
    for toolset, task_scoped in _toolsets(loaded, task_type):
        mcp = MCPServer(toolset.server_name or type(toolset).__name__)
        toolset.register(mcp)
        identity = {
            "toolset": f"{type(toolset).__module__}:{type(toolset).__qualname__}",
            "code": code_fingerprint(type(toolset)),
            "config": toolset.config.model_dump(mode="json"),
            "task_scoped": task_scoped,
            "verifiers": version,
        }
        for entry in run_on_own_loop(mcp.list_tools):
            name = f"{toolset.server_name}_{entry.name}" if toolset.server_name else entry.name
            if any(t.name == name for t in tools):
                raise UserInputError(f"the taskset {taskset} has two tools named {name!r}")
            schema = entry.input_schema or {"type": "object", "properties": {}}
            tools.append(
                Tool(
                    name=name,
                    description=entry.description or name,
                    parameters=schema,
                    permission=Permission.WRITE,
                    source_hash=content_hash({**identity, "tool": entry.name, "schema": schema}),
                    fn_ref=f"{MODULE}:call_tool",
                    timeout_s=timeout_s,
                    bound={"server": toolset.server_name, "tool": entry.name},
                )
            )
    return tuple(tools), state_cls(task_type) is not State
