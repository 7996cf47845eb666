"""An MCP stdio server written with the `mcp` package's own server API: a notebook the agent keeps.

It is the example behind docs/mcp.md: `note` remembers a line, `notes` gives them back, `count`
says how many there are. The server holds its notes in memory, so they last as long as the server:
one episode, when reprorl runs it in the episode's sandbox. Run it by hand with

    python -m reprorl.examples.mcp_notes      # speaks MCP on stdin/stdout
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("reprorl-notes")
_notes: list[str] = []


@server.tool()
def note(text: str) -> str:
    """Remember one line of text."""
    _notes.append(text)
    return f"noted ({len(_notes)} in all)"


@server.tool()
def notes() -> str:
    """Every line remembered so far, oldest first."""
    return "\n".join(_notes)


@server.tool()
def count() -> int:
    """How many lines are remembered."""
    return len(_notes)


if __name__ == "__main__":
    server.run()
