"""Hostile agents: scripted policies that try to cheat or break out. None may ever be paid.

Each probe is blocked or limited, the attempt is classified on its turn, and the secret that
would earn the reward (held only by the orchestrator and the verifier) is never reached.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from test_failure_classes import episode, outcomes, play

from reprorl.actions import render_call
from reprorl.types import Termination, ToolOutcome

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="full sandbox isolation needs root (CI runs as root)"
)


def python(code: str) -> str:
    return render_call("run_python", {"code": code})


def loot_then_answer(code: str) -> list[str]:
    """Run the attack; whatever it returned is written to answer.txt and given as the answer."""
    return [python(code), python("result = open('answer.txt', 'a').write('')"), "whatever I found"]


class Listener:
    """A server on the host's loopback that would hand out the secret to anyone who connects."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def _unpaid(replies: list[str]) -> list[ToolOutcome]:
    trajectory = asyncio.run(episode(play(replies)))
    assert trajectory.reward is not None and trajectory.reward.components["outcome"] == 0.0
    assert trajectory.termination in (Termination.ANSWERED, Termination.MAX_TURNS)
    return outcomes(trajectory)


def test_reading_the_reference_from_the_orchestrator_fails() -> None:
    host = os.getpid()  # the orchestrator holds the task, reference included, in its memory
    seen = _unpaid(
        [
            python(f"result = open('/proc/{host}/environ').read()"),
            python(f"result = open('/proc/{host}/mem', 'rb').read(64)"),
            python(f"result = os.readlink('/proc/{host}/cwd')"),
            "nothing",
        ]
    )
    # The sandbox's /proc belongs to its own PID namespace: the orchestrator's pid is not even there.
    assert seen == [ToolOutcome.TOOL_EXCEPTION] * 3


def test_path_traversal_is_refused() -> None:
    seen = _unpaid(
        [
            render_call("write_file", {"path": "../../../etc/evil", "content": "x"}),
            render_call("write_file", {"path": "/etc/evil", "content": "x"}),
            python("result = open('/root/.bashrc').read()"),
            python("import os\nresult = os.listdir('..')"),
            "none",
        ]
    )
    assert seen[:2] == [ToolOutcome.PERMISSION_DENIED] * 2
    # Root's home: unreadable, or not even there when the interpreter lives in it and only the
    # interpreter's folder is bound into the sandbox's view.
    assert seen[2] in (ToolOutcome.PERMISSION_DENIED, ToolOutcome.TOOL_EXCEPTION)
    assert seen[3] in (ToolOutcome.PERMISSION_DENIED, ToolOutcome.OK)  # listing is allowed, reading is not
    assert not Path("/etc/evil").exists()


def test_network_connections_fail_and_reach_nothing() -> None:
    listener = Listener()
    try:
        attack = f"result = socket.create_connection(('127.0.0.1', {listener.port}), timeout=2).recv(100)"
        outside = "result = socket.create_connection(('1.1.1.1', 80), timeout=2)"
        seen = _unpaid([python(attack), python(outside), "nothing"])
        assert seen == [ToolOutcome.TOOL_EXCEPTION, ToolOutcome.TOOL_EXCEPTION]
        assert listener.connections == 0
    finally:
        listener.close()


def test_fork_bomb_is_bounded_and_leaves_nothing_behind() -> None:
    bomb = "while True:\n    if os.fork() == 0:\n        time.sleep(60)"
    trajectory = asyncio.run(episode(play([python(bomb), python("result = 'still alive'"), "done"])))
    seen = outcomes(trajectory)
    assert seen[0] in (ToolOutcome.TOOL_EXCEPTION, ToolOutcome.TOOL_TIMEOUT)
    assert seen[1] == ToolOutcome.OK
    assert trajectory.reward is not None and trajectory.reward.components["outcome"] == 0.0
    uid = trajectory.sandbox["uid"]
    assert isinstance(uid, int)
    survivors = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == uid]
    assert survivors == []


def _owner(proc: Path) -> int | None:
    try:
        return proc.stat().st_uid
    except OSError:
        return None


def test_allocating_8_gib_is_limited() -> None:
    seen = _unpaid([python("block = bytearray(8 << 30)\nresult = len(block)"), "done"])
    assert seen == [ToolOutcome.TOOL_EXCEPTION]


def test_an_infinite_loop_is_stopped() -> None:
    seen = _unpaid([python("while True:\n    pass"), python("result = 'recovered'"), "done"])
    assert seen == [ToolOutcome.TOOL_TIMEOUT, ToolOutcome.OK]


def test_overwriting_the_verifiers_inputs_fails() -> None:
    verifier_code = Path(__file__).with_name("probe_tools.py")
    before = verifier_code.read_bytes()
    seen = _unpaid(
        [
            python(f"result = open({str(verifier_code)!r}, 'a').write('SecretVerifier.score = None')"),
            python("result = open('../snapshot/answer.txt', 'w').write('secret')"),
            python(
                "import os\nresult = [open(f'../../{d}/work/answer.txt', 'w') for d in os.listdir('../..')]"
            ),
            "done",
        ]
    )
    # Each write is refused (uid permissions) or finds nothing to write to: a path under /tmp, another
    # sandbox's folder and an absent snapshot do not exist in the sandbox's private view.
    assert all(o in (ToolOutcome.PERMISSION_DENIED, ToolOutcome.TOOL_EXCEPTION) for o in seen), seen
    assert verifier_code.read_bytes() == before


FILL_BYTES = "for i in range(40):\n    open(f'fill{i}', 'wb').write(b'x' * (16 << 20))\nresult = 'wrote'"
FILL_INODES = "for i in range(40000):\n    open(f'n{i}', 'w').close()\nresult = 'made'"


def _mounted(path: str) -> bool:
    return any(line.split()[1].startswith(path) for line in Path("/proc/mounts").read_text().splitlines())


@pytest.mark.skipif(os.geteuid() != 0, reason="the work directory's quota is a tmpfs only root can mount")
def test_filling_the_work_directory_stops_at_its_quota_and_leaves_nothing_behind() -> None:
    import probe_tools
    from test_failure_classes import HERE, MODULE, _task

    from reprorl.envs import EnvConfig
    from reprorl.envs.sandbox import SandboxPool
    from reprorl.rewards import VerifierRunner
    from reprorl.rollout import EpisodeIds, EpisodeLimits, ScriptedPolicy, run_episode

    async def both() -> list[Any]:
        task = _task()
        async with SandboxPool([MODULE], sys_path=[HERE]) as pool, VerifierRunner(workers=1) as verifiers:
            done = []
            for replies in (
                [python(FILL_BYTES), python(FILL_INODES), python("result = str(len(os.listdir('.')))"), "x"],
                [render_call("write_file", {"path": "answer.txt", "content": "42"}), "done"],
            ):
                done.append(
                    await run_episode(
                        probe_tools.ProbeEnv(EnvConfig(max_invalid_actions=50)),
                        task,
                        ScriptedPolicy(task, play(replies)),
                        verifier=probe_tools.PlainOpenVerifier(),
                        sandboxes=pool,
                        verifiers=verifiers,
                        ids=EpisodeIds("e2e", f"e2e/{len(done)}"),
                        limits=EpisodeLimits(max_turns=6, wall_s=120),
                    )
                )
            return done

    hostile, honest = asyncio.run(both())
    seen = outcomes(hostile)
    assert seen[:2] == [ToolOutcome.TOOL_EXCEPTION] * 2, [
        r.error for t in hostile.turns for r in t.tool_results
    ]
    errors = [r.error or "" for t in hostile.turns for r in t.tool_results][:2]
    assert all("No space left on device" in e for e in errors), errors
    assert hostile.sandbox["isolation"]["work_quota"] == "tmpfs"  # type: ignore[index]
    assert hostile.sandbox["limits"]["work_bytes"] == 256 << 20  # type: ignore[index]
    assert hostile.reward is not None and hostile.reward.total == 0.0  # the agent's doing: scored
    sandbox_dir = str(hostile.sandbox["dir"])
    assert not Path(sandbox_dir).exists() and not _mounted(sandbox_dir)  # unmounted, then removed
    # The next episode of the same pool starts empty and is paid as usual.
    assert honest.reward is not None and honest.reward.total == 1.0
    assert not _mounted(str(honest.sandbox["dir"]))


FIND_WRITABLE = """
found, stack = [], [('/', 0)]
while stack:
    path, depth = stack.pop()
    if path in ('/proc', '/sys') or depth > 3:
        continue
    try:
        entries = os.scandir(path)
    except OSError:
        continue
    with entries:
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if os.access(entry.path, os.W_OK):
                        found.append(entry.path)
                    stack.append((entry.path, depth + 1))
            except OSError:
                pass
try:
    open('/run/lock/left-for-later', 'w').write('hi')
    found.append('/run/lock (written)')
except OSError:
    pass
result = '|'.join(sorted(found))
"""


@pytest.mark.skipif(
    os.geteuid() != 0, reason="a read-only view of the host needs a mount namespace of its own"
)
def test_no_host_directory_outside_the_sandbox_is_writable_from_it() -> None:
    trajectory = asyncio.run(episode(play([python(FIND_WRITABLE), "done"])))
    (result,) = [r for t in trajectory.turns for r in t.tool_results]
    assert result.outcome is ToolOutcome.OK, result.error
    workdir = os.path.realpath(str(trajectory.sandbox["dir"])) + "/work"
    private = ("/tmp", "/var/tmp", "/dev/shm")
    writable = [p for p in result.content.split("|") if p]
    outside = [p for p in writable if not p.startswith(workdir) and not p.startswith(private)]
    assert outside == [], outside
    assert trajectory.sandbox["isolation"]["host_fs"] == "read_only"  # type: ignore[index]
    assert not Path("/run/lock/left-for-later").exists()
