"""Tools an MCP server serves, as reprorl tools: a stdio server's run in the sandbox, a URL's from here.

`mcp_tools(MCPServerSpec(command=...))` starts the stdio server in a throwaway sandbox, asks it
`tools/list`, and returns one `Tool` per tool it lists (name, description and input schema as the
server gives them). A family puts them among its `tools` and `"reprorl.envs.mcp_bridge"` among its
tool modules; each call then runs `reprorl.envs.mcp_bridge:call_tool` in the episode's sandbox,
where the server is started on first use, confined as the sandbox is (no network, the episode's
files only) and kept for the episode. A tool's version hashes its schema, the server's command, the
name and version it gives in `initialize`, and its package's version: a changed server is a changed
tool. Errors are classified as any tool's: the server's refusal of the arguments is the agent's
`bad_arguments`; a tool error (`isError`), a crash or a hang is the tool's. A server given by URL
(Streamable HTTP) is reached from the orchestrator instead (`mcp_remote.py`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reprorl.envs.mcp_remote import MCPRemote, list_remote
from reprorl.envs.outside import installed_version, run_on_own_loop
from reprorl.envs.sandbox import SandboxPool
from reprorl.envs.tool import Tool
from reprorl.errors import UserInputError
from reprorl.hashing import content_hash
from reprorl.types import Permission

BRIDGE = "reprorl.envs.mcp_bridge"


@dataclass(frozen=True)
class MCPServerSpec:
    """An MCP server: a stdio command the sandbox runs (`{python}` is reprorl's interpreter), or the
    URL of a server already serving Streamable HTTP, whose tools are then called from the host."""

    command: tuple[str, ...] = ()
    url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # the stdio server's environment (PYTHONPATH, ...)
    package: str | None = None  # the Python package that ships the server, whose version is recorded
    timeout_s: float = 30.0  # each call (and the server's start, on its first)

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise UserInputError(
                "an MCP server needs exactly one of command (a stdio server the sandbox runs) or url"
            )


def mcp_tools(
    server: MCPServerSpec,
    *,
    permission: Permission | None = None,
    prefix: str = "",
    only: tuple[str, ...] = (),
) -> tuple[Tool, ...]:
    """The server's tools (those named in `only`, when given), each a reprorl `Tool` (`prefix` added
    to its name). Lists a stdio server's in a sandbox of its own, a URL's from here; blocks until it
    has. `permission` defaults to `write` for a stdio server and `network` for one at a URL (a run
    grants it with `data.tool_permissions`)."""
    if server.url is not None:
        listing = list_remote(server.url, server.timeout_s)
        permission = permission or Permission.NETWORK
    else:
        listing = _listed(server)
        permission = permission or Permission.WRITE
    identity = {
        "url": server.url,
        "command": list(server.command),
        "env": dict(sorted(server.env.items())),
        "package": server.package,
        "package_version": installed_version(server.package),
        "server": listing.get("server") or {},
    }
    tools = []
    for entry in listing.get("tools") or []:
        name = str(entry.get("name", ""))
        if only and name not in only:
            continue
        schema = entry.get("inputSchema") or {"type": "object", "properties": {}}
        # A URL's tool is called from here (host); a stdio server's in the episode's sandbox,
        # through the bridge, whose own limit ends a hung call before the sandbox's does.
        placement: dict[str, Any] = (
            {
                "fn_ref": f"mcp:{server.url}#{name}",
                "timeout_s": server.timeout_s,
                "host": True,
                "remote": MCPRemote(server.url, name, server.timeout_s),
            }
            if server.url is not None
            else {
                "fn_ref": f"{BRIDGE}:call_tool",
                "timeout_s": server.timeout_s + 5.0,
                "bound": {
                    "server": list(server.command),
                    "tool": name,
                    "env": dict(server.env),
                    "timeout_s": server.timeout_s,
                },
            }
        )
        tools.append(
            Tool(
                name=f"{prefix}{name}",
                description=str(entry.get("description") or name),
                parameters=schema,
                permission=permission,
                source_hash=content_hash({**identity, "tool": entry}),
                **placement,
            )
        )
    missing = sorted(set(only) - {t.name[len(prefix) :] for t in tools})
    if missing:
        raise UserInputError(f"the MCP server {server.url or list(server.command)} lists no tool {missing}")
    return tuple(tools)


def _listed(server: MCPServerSpec) -> dict[str, Any]:
    """`tools/list`, run in a sandbox of its own (blocks; the caller may be in an event loop)."""

    async def ask() -> dict[str, Any]:
        async with SandboxPool([BRIDGE]) as pool, pool.open() as sandbox:
            result = await sandbox.call(
                f"{BRIDGE}:list_tools",
                {"server": list(server.command), "env": dict(server.env), "timeout_s": server.timeout_s},
                timeout_s=server.timeout_s + 10.0,
            )
        if not result.ok:
            raise UserInputError(
                f"the MCP server {list(server.command)} could not list its tools: "
                f"{result.error_type}: {result.error}"
            )
        listing: dict[str, Any] = json.loads(result.value)
        return listing

    return run_on_own_loop(ask)
