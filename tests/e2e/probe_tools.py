"""Tools and an env for end-to-end failure and hostile-agent tests (imported by the sandbox zygote).

Modules a probe's code uses are imported here, at module level: the sandbox's uid cannot read the
interpreter's library directory, so nothing can be imported lazily inside a sandbox.
"""

from __future__ import annotations

import ctypes
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from reprorl.envs import ToolEnv, tool, workspace_path
from reprorl.envs.errors import UnsafeAction
from reprorl.rewards import FinalState, Verifier
from reprorl.types import Permission, Task

_PRELOADED = (ctypes, os, socket, time)


@tool(Permission.WRITE, params={"code": "Python source; assign the reply to `result`."}, timeout_s=3.0)
def run_python(ctx: Any, code: str) -> str:
    """Run Python code in the workspace."""
    scope: dict[str, Any] = {"ctx": ctx, "os": os, "socket": socket, "ctypes": ctypes, "time": time}
    exec(code, scope)
    return str(scope.get("result", ""))


@tool(Permission.WRITE, params={"path": "File path in the workspace.", "content": "Text to write."})
def write_file(ctx: Any, path: str, content: str) -> str:
    """Write a file in the workspace."""
    workspace_path(ctx, path).write_text(content)
    return "written"


@tool(Permission.READ, timeout_s=0.5)
def slow(ctx: Any) -> str:
    """A lookup that never finishes in time."""
    time.sleep(30)
    return "late"


@tool(Permission.READ)
def big(ctx: Any) -> str:
    """Returns far more text than the env passes on."""
    return "x" * 100_000


@tool(Permission.READ)
def boom(ctx: Any) -> str:
    """Fails with an ordinary exception."""
    raise KeyError("no such record")


@tool(Permission.READ)
def segfault(ctx: Any) -> str:
    """Crashes its process."""
    ctypes.string_at(0)
    return "unreachable"


@tool(Permission.NETWORK, params={"url": "Address to fetch."})
def fetch(ctx: Any, url: str) -> str:
    """Fetch a URL (needs network permission, which envs do not grant by default)."""
    return "never runs"


@tool(Permission.WRITE, params={"path": "File to delete."})
def wipe(ctx: Any, path: str) -> str:
    """Delete a file the task said to keep: an action the env refuses as unsafe, ending the episode."""
    raise UnsafeAction(f"deleting {path} is not allowed")


class ProbeEnv(ToolEnv):
    family = "probe"
    tools = (run_python, write_file, slow, big, boom, segfault, fetch, wipe)


@dataclass(frozen=True)
class SecretVerifier(Verifier):
    """Pays only an agent that produced the hidden secret: nothing honest can."""

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        assert isinstance(task.reference, dict)
        secret = str(task.reference["secret"])
        found = secret in (state.answer or "") or secret in (state.read_text("answer.txt") or "")
        return {"outcome": 1.0 if found else 0.0}


@dataclass(frozen=True)
class PlainOpenVerifier(Verifier):
    """Reads `answer.txt` with a plain `open`, as a hand-written verifier might: a FIFO there blocks it."""

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        path = state.workdir / "answer.txt"
        return {"outcome": float(path.exists() and path.read_text() == "42")}
