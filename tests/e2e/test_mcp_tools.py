"""Tools an MCP stdio server serves (the `mcp` package's own server API), run in the episode's sandbox.

The server is listed in a sandbox of its own, then started inside the episode's sandbox on its
first call and kept for the episode (its notes persist between calls); it cannot reach the host's
network nor read the store that holds the task's reference; its errors are classified.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from reprorl.actions import render_call
from reprorl.envs.base import EnvConfig, ToolEnv
from reprorl.envs.mcp_tools import MCPServerSpec, mcp_tools
from reprorl.envs.sandbox import SandboxPool
from reprorl.rewards import VerifierRunner
from reprorl.rewards.verifiers.numeric import NumericAnswer
from reprorl.rollout.episode import EpisodeIds, EpisodeLimits, ScriptedPolicy, run_episode
from reprorl.store import Store
from reprorl.types import Message, Permission, Role, Split, Task, TaskSet, ToolOutcome, Trajectory

SERVER = MCPServerSpec(
    command=("{python}", str(Path(__file__).resolve().parents[1] / "envs" / "mcp_probes.py")), package="mcp"
)
SECRET = "the-reference-is-4242"


@pytest.fixture(scope="module")
def env_class() -> type[ToolEnv]:
    tools = mcp_tools(SERVER)
    return type("NotesEnv", (ToolEnv,), {"family": "mcp-notes", "tools": tools})


@pytest.fixture
def host_page() -> Iterator[str]:
    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"the host's network")

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


def episode(
    env_class: type[ToolEnv],
    calls: Sequence[tuple[str, dict[str, Any]]],
    answer: str,
    config: EnvConfig | None = None,
) -> Trajectory:
    task = Task(
        id="notes-0",
        family="mcp-notes",
        prompt=(Message(role=Role.USER, content="Add 2 and 3."),),
        reference={"answer": 5, "secret": SECRET},
    )
    script = [render_call(name, arguments) for name, arguments in calls] + [answer]

    def act(task: Task, messages: Sequence[Message]) -> str:
        return script[sum(1 for m in messages if m.role is Role.ASSISTANT)]

    async def run() -> Trajectory:
        async with SandboxPool(["reprorl.envs.mcp_bridge"]) as pool, VerifierRunner() as verifiers:
            return await run_episode(
                env_class(config or EnvConfig(), seed=0),
                task,
                ScriptedPolicy(task, act),
                verifier=NumericAnswer(),
                sandboxes=pool,
                verifiers=verifiers,
                ids=EpisodeIds("run", "run/train/0/notes-0/0", "g", 3),
                limits=EpisodeLimits(max_turns=len(script) + 1),
            )

    return asyncio.run(run())


def results(trajectory: Trajectory) -> list[Any]:
    return [r for turn in trajectory.turns for r in turn.tool_results]


def test_the_servers_tools_are_listed_with_their_schemas_and_versions(env_class: type[ToolEnv]) -> None:
    by_name = {t.name: t for t in env_class.tools}
    assert {"add", "note", "notes", "fetch", "read", "env", "fail"} <= set(by_name)
    assert by_name["add"].parameters["required"] == ["a", "b"]
    assert by_name["add"].argument_error({"a": 1}) is not None
    assert len({t.version for t in env_class.tools}) == len(env_class.tools)
    assert by_name["add"].version == mcp_tools(SERVER, only=("add",))[0].version


def test_an_episode_calls_them_and_one_server_keeps_its_state(env_class: type[ToolEnv]) -> None:
    calls = [
        ("add", {"a": 2, "b": 3}),
        ("note", {"text": "first"}),
        ("note", {"text": "second"}),
        ("notes", {}),
    ]
    trajectory = episode(env_class, calls, "The sum is 5.")
    assert trajectory.reward is not None and trajectory.reward.components["outcome"] == 1.0
    got = [(r.name, r.outcome, r.content) for r in results(trajectory)]
    assert got == [
        ("add", ToolOutcome.OK, "5"),
        ("note", ToolOutcome.OK, "1 notes"),
        ("note", ToolOutcome.OK, "2 notes"),
        ("notes", ToolOutcome.OK, "first\nsecond"),
    ]
    assert trajectory.tool_versions["add"] == {t.name: t for t in env_class.tools}["add"].version


def test_the_server_cannot_reach_the_network_or_the_reference(
    env_class: type[ToolEnv], host_page: str, tmp_path: Path
) -> None:
    store = Store(tmp_path / "home")
    store.add_bytes(
        "notes-train",
        TaskSet(
            name="notes-train",
            tasks=(
                Task(
                    id="x",
                    family="mcp-notes",
                    prompt=(Message(role=Role.USER, content="x"),),
                    reference=SECRET,
                    split=Split.TRAIN,
                ),
            ),
        ).to_jsonl(),
        kind="taskset",
    )
    calls = [("fetch", {"url": host_page}), ("read", {"path": str(tmp_path / "home")}), ("env", {})]
    trajectory = episode(env_class, calls, "5")
    fetched, read, environment = results(trajectory)
    assert fetched.outcome is ToolOutcome.TOOL_EXCEPTION and "host's network" not in (fetched.content or "")
    assert read.outcome is ToolOutcome.TOOL_EXCEPTION and SECRET not in (read.content or "") + (
        read.error or ""
    )
    assert environment.outcome is ToolOutcome.OK and SECRET not in environment.content
    assert all(SECRET not in json.dumps(r.model_dump()) for r in results(trajectory))


def test_its_errors_are_classified(env_class: type[ToolEnv]) -> None:
    calls = [("fail", {}), ("add", {"a": "two", "b": 3}), ("nope", {})]
    failed, refused, unknown = results(episode(env_class, calls, "5"))
    assert failed.outcome is ToolOutcome.TOOL_EXCEPTION and "tool fail" in (failed.error or "")
    assert refused.outcome is ToolOutcome.BAD_ARGUMENTS  # the schema, before the server sees it
    assert unknown.outcome is ToolOutcome.UNKNOWN_TOOL


@pytest.fixture
def http_server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = Path(__file__).resolve().parents[1] / "envs" / "mcp_probes.py"
    process = subprocess.Popen([sys.executable, str(script), "--http", str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        process.kill()
        process.wait(10)


NETWORK = EnvConfig(allowed=frozenset({Permission.READ, Permission.WRITE, Permission.NETWORK}))


def test_a_servers_tools_at_a_url_are_host_tools_that_need_the_network_permission(
    http_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, process = http_server
    tools = mcp_tools(MCPServerSpec(url=url, timeout_s=10), only=("add", "note", "notes"))
    assert all(t.host and t.permission is Permission.NETWORK and t.remote is not None for t in tools)
    remote = type("RemoteNotes", (ToolEnv,), {"family": "mcp-remote", "tools": tools})
    calls = [("add", {"a": 2, "b": 3}), ("note", {"text": "over http"}), ("notes", {})]
    got = [(r.name, r.outcome, r.content) for r in results(episode(remote, calls, "5", NETWORK))]
    assert got == [
        ("add", ToolOutcome.OK, "5"),
        ("note", ToolOutcome.OK, "1 notes"),
        ("notes", ToolOutcome.OK, "over http"),
    ]
    denied = results(episode(remote, calls[:1], "5"))  # the run did not grant `network`
    assert [r.outcome for r in denied] == [ToolOutcome.PERMISSION_DENIED]
    process.kill()
    process.wait(10)
    (gone,) = results(episode(remote, calls[:1], "5", NETWORK))
    assert gone.outcome is ToolOutcome.INFRA_ERROR and url in (gone.error or "")
