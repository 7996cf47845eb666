"""Hostile probes, one episode each on one shared pool: every probe is blocked or limited, its rollout
classified and unpaid, nothing it started outlives its episode, nothing it wrote outside its sandbox
survives, and an honest episode on the same pool afterwards is paid as usual.

A probe is the body of a function that returns only if the attack worked: it is run as
`attack(); result = 'ESCAPED'`, any exception meaning it was stopped.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import probe_tools
import pytest
from test_failure_classes import HERE, MODULE, _task, play

from reprorl.actions import render_call
from reprorl.envs import EnvConfig
from reprorl.envs.sandbox import SandboxPool
from reprorl.rewards import VerifierRunner
from reprorl.rollout import EpisodeIds, EpisodeLimits, ScriptedPolicy, run_episode
from reprorl.types import ScoreFailure, Trajectory

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="full sandbox isolation needs root (CI runs as root)"
)

HOST = os.getpid()
ABSTRACT = b"\0reprorl-hostile-probe"
HOST_SOCKET = Path(f"/run/reprorl-hostile-probe-{HOST}.sock")
# (id, body, host paths that must not exist afterwards, kind): "blocked" probes must not say ESCAPED;
# "planted" ones leave what scores agent_state; "outlive" ones start what must be gone at the end.
PROBES: list[tuple[str, str, tuple[str, ...], str]] = [
    (
        "write /run/lock",
        "open('/run/lock/reprorl-probe', 'w').write('x')",
        ("/run/lock/reprorl-probe",),
        "blocked",
    ),
    (
        "write /var/lock",
        "open('/var/lock/reprorl-probe', 'w').write('x')",
        ("/var/lock/reprorl-probe",),
        "blocked",
    ),
    ("write /etc", "open('/etc/reprorl-probe', 'w').write('x')", ("/etc/reprorl-probe",), "blocked"),
    ("write /", "open('/reprorl-probe', 'w').write('x')", ("/reprorl-probe",), "blocked"),
    (
        "write /usr/local",
        "open('/usr/local/reprorl-probe', 'w').write('x')",
        ("/usr/local/reprorl-probe",),
        "blocked",
    ),
    ("write /dev", "open('/dev/reprorl-probe', 'w').write('x')", ("/dev/reprorl-probe",), "blocked"),
    ("write /root", "open('/root/reprorl-probe', 'w').write('x')", ("/root/reprorl-probe",), "blocked"),
    ("make a device", "os.mknod('null2', 0o600 | 0o020000, os.makedev(1, 3))", (), "blocked"),
    ("rename its directory, which names its owner", "os.rename('..', '../../sbx-1.1.evil')", (), "blocked"),
    ("write beside work/", "open('../snapshot-evil', 'w').write('x')", (), "blocked"),
    ("write the pool root", "open('../../reprorl-probe', 'w').write('x')", (), "blocked"),
    ("list other sandboxes", "assert os.listdir('../..')", (), "blocked"),
    ("write /proc/sys", "open('/proc/sys/kernel/hostname', 'w').write('evil')", (), "blocked"),
    ("write /sys", "open('/sys/kernel/uevent_helper', 'w').write('/evil')", (), "blocked"),
    (
        "mount a filesystem",
        "os.mkdir('m')\n"
        "if ctypes.CDLL(None).mount(b'tmpfs', b'm', b'tmpfs', 0, None):\n"
        "    raise OSError('refused')",
        (),
        "blocked",
    ),
    ("chroot", "os.chroot('.')", (), "blocked"),
    ("become root", "os.setuid(0)", (), "blocked"),
    ("take root's group", "os.setgid(0)", (), "blocked"),
    ("signal the orchestrator", f"os.kill({HOST}, 0)", (), "blocked"),
    (
        "ptrace the orchestrator",
        f"if ctypes.CDLL(None).ptrace(16, {HOST}, 0, 0) != 0:\n    raise OSError('refused')",
        (),
        "blocked",
    ),
    ("read /etc/shadow", "assert open('/etc/shadow').read()", (), "blocked"),
    (
        "a host daemon's unix socket",
        f"socket.socket(socket.AF_UNIX).connect({str(HOST_SOCKET)!r})",  # world-connectable, under /run
        (),
        "blocked",
    ),
    ("an abstract unix socket", f"socket.socket(socket.AF_UNIX).connect({ABSTRACT!r})", (), "blocked"),
    (
        "UDP out",
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.sendto(b'x', ('8.8.8.8', 53))\ns.settimeout(1)\ns.recv(10)",
        (),
        "blocked",
    ),
    ("IPv6 loopback", "socket.create_connection(('::1', 22), timeout=1)", (), "blocked"),
    (
        "the orchestrator's environment",
        "assert set(os.environ) - {'HOME', 'TMPDIR', 'PATH', 'LANG'}",
        (),
        "blocked",
    ),
    ("exhaust file descriptors", "keep = [open(f'fd{i}', 'w') for i in range(100000)]", (), "blocked"),
    ("hard link a host file", "os.link('/etc/passwd', 'passwd')", (), "blocked"),
    (
        "a huge file",
        "f = open('huge', 'wb')\nfor _ in range(2048):\n    f.write(b'0' * (1 << 20))",
        (),
        "blocked",
    ),
    (
        "fill /dev/shm",
        "f = open('/dev/shm/fill', 'wb')\nfor _ in range(2048):\n    f.write(b'0' * (1 << 20))",
        (),
        "blocked",
    ),
    (
        "a daemon that outlives the call",
        "if os.fork() == 0:\n    os.setsid()\n    time.sleep(300)\n    os._exit(0)",
        (),
        "outlive",
    ),
    ("a socket as the answer", "socket.socket(socket.AF_UNIX).bind('answer.txt')", (), "planted"),
    ("a FIFO as the answer", "os.mkfifo('answer.txt')", (), "planted"),
    ("a link to a host file as the answer", "os.symlink('/etc/hostname', 'answer.txt')", (), "planted"),
]


def _code(body: str) -> str:
    indented = "\n".join("    " + line for line in body.splitlines())
    return (
        f"def attack():\n{indented}\n"
        "try:\n    attack()\n    result = 'ESCAPED'\n"
        "except BaseException as exc:\n    result = 'blocked: ' + type(exc).__name__ + ': ' + str(exc)[:100]"
    )


def _uid_processes(uid: int) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if proc.stat().st_uid == uid:
                    found.append(proc.name)
            except OSError:
                pass
    return found


def test_every_hostile_probe_is_stopped_unpaid_and_leaves_nothing() -> None:
    assert len(PROBES) >= 30
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(ABSTRACT)
    listener.listen(1)
    listener.settimeout(0.1)
    daemon = socket.socket(socket.AF_UNIX)  # a host service anyone may connect to
    HOST_SOCKET.unlink(missing_ok=True)
    daemon.bind(str(HOST_SOCKET))
    HOST_SOCKET.chmod(0o777)
    daemon.listen(1)
    daemon.settimeout(0.1)

    async def all_of_them() -> tuple[list[Trajectory], list[list[str]], Trajectory]:
        task = _task()
        async with SandboxPool([MODULE], sys_path=[HERE]) as pool, VerifierRunner(workers=1) as verifiers:

            async def one(replies: list[str], verifier: Any, n: int) -> Trajectory:
                return await run_episode(
                    probe_tools.ProbeEnv(EnvConfig(max_invalid_actions=50)),
                    task,
                    ScriptedPolicy(task, play(replies)),
                    verifier=verifier,
                    sandboxes=pool,
                    verifiers=verifiers,
                    ids=EpisodeIds("e2e", f"e2e/{n}"),
                    limits=EpisodeLimits(max_turns=4, wall_s=60),
                )

            done, survivors = [], []
            for n, (_, body, _, _) in enumerate(PROBES):
                trajectory = await one(
                    [render_call("run_python", {"code": _code(body)}), "done"],
                    probe_tools.SecretVerifier(),
                    n,
                )
                done.append(trajectory)
                survivors.append(_uid_processes(int(trajectory.sandbox["uid"])))  # type: ignore[arg-type]
            honest = [render_call("write_file", {"path": "answer.txt", "content": "42"}), "done"]
            return done, survivors, await one(honest, probe_tools.PlainOpenVerifier(), len(PROBES))

    try:
        trajectories, survivors, honest = asyncio.run(all_of_them())
        for server in (listener, daemon):
            with pytest.raises(TimeoutError):
                server.accept()  # nothing reached the host's sockets
    finally:
        listener.close()
        daemon.close()
        HOST_SOCKET.unlink(missing_ok=True)
    for (name, _, paths, kind), trajectory, alive in zip(PROBES, trajectories, survivors, strict=True):
        results = [r for t in trajectory.turns for r in t.tool_results]
        said = " ".join(r.content or r.error or "" for r in results)
        ran = all(e not in said for e in ("NameError", "SyntaxError", "AttributeError", "TypeError"))
        assert ran, (name, said)  # the probe itself ran: it was stopped, not broken
        if kind == "blocked":
            assert "ESCAPED" not in said, (name, said)
        if kind == "planted":
            assert trajectory.score_failure is ScoreFailure.AGENT_STATE, (name, trajectory.score_failure)
        assert trajectory.reward is not None and trajectory.reward.total == 0.0, name  # classified, unpaid
        assert results and all(r.outcome for r in results), name
        assert alive == [], (name, alive)  # nothing outlives its episode
        for path in paths:
            assert not Path(path).exists(), (name, path)  # nothing written outside survives
        assert not Path(str(trajectory.sandbox["dir"])).exists(), name
    assert honest.reward is not None and honest.reward.total == 1.0  # and the pool is as good as new
