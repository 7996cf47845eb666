"""An MCP stdio server (the `mcp` package's own server API) of probes, for the MCP tools tests.

`add` computes, `note`/`notes` keep state in the server's memory (one server serves a whole
episode), `fetch` tries the network, `read` tries a path, `env` shows the server's environment.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("notes")
_notes: list[str] = []


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def note(text: str) -> str:
    """Remember a note."""
    _notes.append(text)
    return f"{len(_notes)} notes"


@server.tool()
def notes() -> str:
    """Every note so far, one per line."""
    return "\n".join(_notes)


@server.tool()
def fetch(url: str) -> str:
    """The body of a URL."""
    with urllib.request.urlopen(url, timeout=3) as response:
        return response.read().decode()


@server.tool()
def read(path: str) -> str:
    """The text of a file, or every file under a folder, concatenated."""
    target = Path(path)
    if target.is_dir():
        return "\n".join(p.read_text(errors="replace") for p in sorted(target.rglob("*")) if p.is_file())
    return target.read_text(errors="replace")


@server.tool()
def env() -> str:
    """The server's environment variables."""
    return "\n".join(f"{k}={v}" for k, v in sorted(os.environ.items()))


@server.tool()
def fail() -> str:
    """Always fails."""
    raise RuntimeError("this tool always fails")


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--http":  # Streamable HTTP on 127.0.0.1:PORT/mcp
        server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
