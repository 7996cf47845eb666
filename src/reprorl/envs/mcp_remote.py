"""Tools an MCP server serves over Streamable HTTP at a URL: called from the orchestrator, per episode.

A server reached by URL runs outside reprorl (it may need the network, or hold resources of its
own), so its tools are host tools: the env calls them with the `mcp` package's own client, opening
one MCP session per server on the episode's first call and closing it when the episode ends, so a
server that keeps per-session state keeps it for the episode. Every call has a time limit. A
server that cannot be reached is the platform's `infra_error`, never the agent's; its refusal of the
arguments is the agent's `bad_arguments`; a tool error (`isError`) is the tool's.
"""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from reprorl.envs.calls import CallOutcome
from reprorl.envs.outside import run_on_own_loop
from reprorl.types import ToolOutcome

INVALID_PARAMS = -32602


@dataclass(frozen=True)
class MCPRemote:
    """Where one host tool's calls go: the server's URL and the tool's name there."""

    url: str
    tool: str
    timeout_s: float


class RemoteSessions:
    """An episode's MCP sessions, one per server URL, opened on first use."""

    def __init__(self) -> None:
        self._stack = AsyncExitStack()
        self._clients: dict[str, Any] = {}

    async def call(
        self, call_id: str, name: str, remote: MCPRemote, arguments: dict[str, Any]
    ) -> CallOutcome:
        """One `tools/call`, classified."""
        from mcp import MCPError

        try:
            async with asyncio.timeout(remote.timeout_s):
                client = await self._client(remote)
                result = await client.call_tool(remote.tool, arguments)
        except TimeoutError:
            detail = f"the MCP server at {remote.url} did not answer within {remote.timeout_s:.0f} s"
            return CallOutcome.error(call_id, name, ToolOutcome.TOOL_TIMEOUT, detail)
        except MCPError as exc:
            code = getattr(getattr(exc, "error", None), "code", None)
            outcome = ToolOutcome.BAD_ARGUMENTS if code == INVALID_PARAMS else ToolOutcome.TOOL_EXCEPTION
            return CallOutcome.error(call_id, name, outcome, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # refused, reset, unreadable: the server is not there for us
            self._clients.pop(remote.url, None)
            detail = f"the MCP server at {remote.url} failed: {type(exc).__name__}: {exc}"
            return CallOutcome.error(call_id, name, ToolOutcome.INFRA_ERROR, detail)
        text = "\n".join(
            str(getattr(part, "text", ""))
            if getattr(part, "type", "") == "text"
            else f"[{part.type} content]"
            for part in result.content
        )
        if result.is_error:
            return CallOutcome.error(
                call_id, name, ToolOutcome.TOOL_EXCEPTION, text or "the tool reported an error"
            )
        return CallOutcome.ok(call_id, name, text, 0.0, 1 << 30)

    async def _client(self, remote: MCPRemote) -> Any:
        from mcp import Client

        client = self._clients.get(remote.url)
        if client is None:
            client = await self._stack.enter_async_context(
                Client(remote.url, read_timeout_seconds=remote.timeout_s)
            )
            self._clients[remote.url] = client
        return client

    async def aclose(self) -> None:
        self._clients.clear()
        with contextlib.suppress(Exception):  # a server gone away takes its end of the session with it
            await self._stack.aclose()


def list_remote(url: str, timeout_s: float) -> dict[str, Any]:
    """`tools/list` and the server's identity (blocks; the caller may be in an event loop)."""

    async def ask() -> dict[str, Any]:
        from mcp import Client

        async with asyncio.timeout(timeout_s), Client(url, read_timeout_seconds=timeout_s) as client:
            listed = await client.list_tools()
            info = client.server_info
            return {
                "tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed.tools],
                "server": info.model_dump(mode="json", exclude_none=True) if info is not None else {},
            }

    return run_on_own_loop(ask)
