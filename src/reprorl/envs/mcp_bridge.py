"""MCP stdio servers inside an episode's sandbox: started on first use, spoken to in JSON-RPC, kept.

These functions run in the sandbox process (forked from the pool's zygote, under the sandbox's uid,
in its network namespace, in the episode's working directory). The server is the sandbox's own
child, so it has the sandbox's confinement: no network, no view of the task's reference (which never
enters a sandbox), the episode's files only. One server process per command lives as long as the
sandbox process does and serves every call of the episode, keeping whatever state it holds; it
dies with the sandbox. The MCP stdio transport is newline-delimited JSON-RPC 2.0: `initialize`,
then `tools/list` and `tools/call`.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import IO, Any

from reprorl.envs.errors import InvalidArguments

PROTOCOL_VERSION = "2025-06-18"
MAX_LINE_BYTES = 4 << 20
INVALID_PARAMS = -32602
METHOD_NOT_FOUND = -32601


class MCPServerError(Exception):
    """The server broke the protocol, died, or did not answer in time (the tool's failure)."""


class MCPToolError(Exception):
    """The tool ran and reported an error (`isError`)."""


class _Server:
    """One stdio server process and its JSON-RPC channel."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], timeout_s: float) -> None:
        # The server's stderr, in the sandbox's private /tmp; open as long as the server runs.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115
        argv = [sys.executable if part == "{python}" else part for part in argv]
        try:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.log,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
            )
        except OSError as exc:
            raise MCPServerError(f"the MCP server {list(argv)} could not start: {exc}") from exc
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin: IO[bytes] = self.process.stdin
        self.stdout: IO[bytes] = self.process.stdout
        os.set_blocking(self.stdout.fileno(), False)
        self.buffer = b""
        self.ids = 0
        self.info = self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "reprorl", "version": "1"},
            },
            timeout_s,
        )
        self.notify("notifications/initialized")

    def notify(self, method: str) -> None:
        self._send({"jsonrpc": "2.0", "method": method})

    def request(self, method: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.ids += 1
        number = self.ids
        self._send({"jsonrpc": "2.0", "id": number, "method": method, "params": params})
        deadline = time.monotonic() + timeout_s
        while True:
            message = self._receive(deadline)
            if "method" in message:  # the server asks something of the client: nothing is offered
                if "id" in message:
                    self._send(
                        {
                            "jsonrpc": "2.0",
                            "id": message["id"],
                            "error": {"code": METHOD_NOT_FOUND, "message": "not offered"},
                        }
                    )
                continue
            if message.get("id") != number:
                continue
            if "error" in message:
                error = message["error"] if isinstance(message["error"], dict) else {}
                text = str(error.get("message", "error"))
                if error.get("code") == INVALID_PARAMS:
                    raise InvalidArguments(text)
                raise MCPToolError(f"{method}: {text}")
            result = message.get("result")
            if not isinstance(result, dict):
                raise MCPServerError(f"{method}: the server's result is not an object")
            return result

    def alive(self) -> bool:
        return self.process.poll() is None

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.stdin.write(json.dumps(message).encode() + b"\n")
            self.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise MCPServerError(f"the MCP server is gone ({exc}); {self.stderr_tail()}") from exc

    def _receive(self, deadline: float) -> dict[str, Any]:
        selector = selectors.DefaultSelector()
        selector.register(self.stdout, selectors.EVENT_READ)
        try:
            while b"\n" not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MCPServerError("the MCP server did not answer in time")
                if not selector.select(left):
                    continue
                chunk = self.stdout.read(65536)
                if not chunk:
                    code = self.process.wait()
                    raise MCPServerError(f"the MCP server exited ({code}): {self.stderr_tail()}")
                self.buffer += chunk
                if len(self.buffer) > MAX_LINE_BYTES and b"\n" not in self.buffer:
                    raise MCPServerError(f"the MCP server sent a message over {MAX_LINE_BYTES} bytes")
        finally:
            selector.close()
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError as exc:
            raise MCPServerError(f"the MCP server wrote something that is not JSON: {line[:200]!r}") from exc
        if not isinstance(message, dict):
            raise MCPServerError("the MCP server sent a message that is not an object")
        return message

    def stderr_tail(self, limit: int = 1000) -> str:
        with contextlib.suppress(OSError):
            self.log.seek(0)
            return self.log.read().decode("utf-8", "replace")[-limit:]
        return ""


_SERVERS: dict[tuple[str, ...], _Server] = {}


def _server(argv: Sequence[str], env: dict[str, str], timeout_s: float) -> _Server:
    key = (*argv, *sorted(f"{k}={v}" for k, v in env.items()))
    found = _SERVERS.get(key)
    if found is None or not found.alive():
        found = _SERVERS[key] = _Server(argv, env, timeout_s)
    return found


def list_tools(
    ctx: Any, *, server: Sequence[str], env: dict[str, str] | None = None, timeout_s: float = 60.0
) -> str:
    """The server's `tools/list` and `initialize` answers, as JSON."""
    running = _server(server, env or {}, timeout_s)
    tools: list[Any] = []
    cursor: str | None = None
    while True:
        page = running.request("tools/list", {"cursor": cursor} if cursor else {}, timeout_s)
        tools += page.get("tools") or []
        cursor = page.get("nextCursor")
        if not cursor:
            break
    return json.dumps({"tools": tools, "server": running.info.get("serverInfo") or {}})


def call_tool(
    ctx: Any,
    *,
    server: Sequence[str],
    tool: str,
    arguments: dict[str, Any],
    env: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> str:
    """One `tools/call`: the text the tool returned, or its error raised (classified by the env)."""
    result = _server(server, env or {}, timeout_s).request(
        "tools/call", {"name": tool, "arguments": arguments}, timeout_s
    )
    text = _text(result)
    if result.get("isError"):
        raise MCPToolError(text or "the tool reported an error")
    return text


def _text(result: dict[str, Any]) -> str:
    parts = []
    for item in result.get("content") or []:
        if isinstance(item, dict) and item.get("type") == "text":
            parts.append(str(item.get("text", "")))
        elif isinstance(item, dict):
            parts.append(f"[{item.get('type', 'content')} content]")
    if not parts and "structuredContent" in result:
        parts.append(json.dumps(result["structuredContent"], ensure_ascii=False, sort_keys=True))
    return "\n".join(parts)
