"""Concurrent episodes against slow tools: throughput against the concurrency bound C / latency.

C episodes run at once; each makes K tool calls that each take L seconds inside its sandbox
(a real sleep in the sandboxed process), then answers. If nothing but the tools took time,
the rate would be C / (K * L) episodes per second; the printed ratio says how close the env
layer (sandbox per episode, IPC, verifier, records) comes to that bound.

The machine has its own bound below that one, measured in the same run: a minimal baseline of the
same work shape in a bare interpreter (asyncio, no reprorl): per episode, fork a child that sets
its own session and resource limits, make K request/response round trips over a socket pair with
the child sleeping L per request, and reap it (by pidfd, off the event loop's critical path). It
runs twice: `bare` (no more than that) and, as root, `confined`: the confinement a sandbox gets,
in raw system calls (the episode's directory with a bounded tmpfs as its work dir, a PID namespace
whose init the child is, new network, IPC and mount namespaces, a private /tmp and /proc, every
other mount read-only, a dedicated uid, no_new_privs; SIGKILL to the init, unmount, remove). The
ratio to `confined` says how much of what the machine can do with that isolation the env layer
uses; the ratio to `bare`, what the isolation itself costs on top. CPU per episode is split by
process: this one, the zygote with the sandboxes it reaped, the verifier workers. The pool and the
baselines are measured `--rounds` times, interleaved, and the median round is reported: on a shared
box one run's ratio moves by a fifth.

    python bench/envs.py [--episodes 256] [--concurrency 256] [--calls 4] [--latency-ms 10] [--warm N]
        [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
from rss import peak_rss_mib

# From the public API, as a user's tool module imports (the zygote imports this module too).
from reprorl import (
    EpisodeIds,
    FinalState,
    Message,
    Permission,
    Role,
    SandboxPool,
    ScriptedPolicy,
    Task,
    ToolEnv,
    Verifier,
    VerifierRunner,
    render_call,
    run_episode,
    tool,
)


@tool(Permission.READ, params={"ms": "How long the lookup takes, in milliseconds."})
def lookup(ctx: Any, ms: int) -> str:
    """A slow read-only lookup."""
    time.sleep(ms / 1000)
    return "ok"


class SlowEnv(ToolEnv):
    family = "slow"
    tools = (lookup,)


class Always(Verifier):
    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        return {"outcome": 1.0}


def _script(calls: int, ms: int) -> Any:
    def script(task: Task, messages: Any) -> str:
        made = sum(1 for m in messages if m.role == Role.TOOL)
        return render_call("lookup", {"ms": ms}) if made < calls else "done"

    return script


async def _run(
    episodes: int, concurrency: int, calls: int, ms: int, warm: int = 0
) -> tuple[float, int, Counter[str], dict[str, float]]:
    task = Task(id="t", family="slow", prompt=(Message(role=Role.USER, content="go"),), tools=("lookup",))
    gate = asyncio.Semaphore(concurrency)
    async with (
        SandboxPool(
            [__name__ if __name__ != "__main__" else "envs"],
            sys_path=[Path(__file__).parent],
            warm=warm,
        ) as pool,
        VerifierRunner() as verifiers,
    ):
        failures: Counter[str] = Counter()

        async def one(i: int) -> bool:
            async with gate:
                t = await run_episode(
                    SlowEnv(),
                    task,
                    ScriptedPolicy(task, _script(calls, ms)),
                    verifier=Always(),
                    sandboxes=pool,
                    verifiers=verifiers,
                    ids=EpisodeIds("bench", f"bench/{i}"),
                )
                scored = t.reward is not None and t.reward.total == 1.0
                if not scored:
                    outcomes = sorted(
                        {r.outcome.value for turn in t.turns for r in turn.tool_results} - {"ok"}
                    )
                    failures[f"{t.termination.value} {outcomes} {t.error or ''}"[:160]] += 1
                return scored

        # Warm up the zygote and every verifier worker (each starts on its first call).
        await asyncio.gather(*[one(-1 - w) for w in range(verifiers.workers)])
        failures.clear()
        zygote = pool._zygote.pid if pool._zygote is not None else -1
        before = cpu_by_process(zygote)
        start = time.perf_counter()
        ok = await asyncio.gather(*[one(i) for i in range(episodes)])
        elapsed = time.perf_counter() - start
        after = cpu_by_process(zygote)
        spent = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
        return elapsed, sum(ok), failures, spent


def cpu_by_process(zygote: int) -> dict[str, float]:
    """CPU seconds so far of this process, of the zygote with the sandboxes it forked and reaped, and
    of every other process this one started (the verifier workers) with what they reaped."""
    me = psutil.Process()
    spent = {"this process": sum(me.cpu_times()[:2]), "zygote + sandboxes": 0.0, "verifier workers": 0.0}
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            times = child.cpu_times()
            own = times.user + times.system + times.children_user + times.children_system
            parent = child.ppid()
            if child.pid == zygote:
                spent["zygote + sandboxes"] += own
            elif parent != zygote and parent == me.pid:
                spent["verifier workers"] += own
    return spent


BASELINE = r"""
import asyncio, ctypes, os, resource, shutil, signal, socket, sys, tempfile, time

EPISODES, CONCURRENCY, CALLS = map(int, sys.argv[1:4])
LATENCY_S = float(sys.argv[4])
CONFINED = sys.argv[5] == "confined"
REQUEST = b'{"tool": "lookup", "arguments": {"ms": 10}, "id": "call-0"}'
REPLY = b'{"ok": true, "value": "ok", "duration_s": 0.01}'
NEWNS, NEWNET, NEWIPC, NEWPID = 0x20000, 0x40000000, 0x08000000, 0x20000000
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 0x20, 0x1000, 0x4000, 0x40000
libc = ctypes.CDLL(None, use_errno=True)
ROOT = tempfile.mkdtemp(prefix="reprorl-baseline-", dir="/tmp")
MOUNTS = [line.split()[4] for line in open("/proc/self/mountinfo")]
OWN_PID_NS = os.open("/proc/self/ns/pid", os.O_RDONLY) if CONFINED else -1
if CONFINED:
    # The baseline's own mount namespace: the work filesystems it mounts vanish with it, even if it
    # dies half way (left in the host's, each would slow every later mount namespace's copy).
    if libc.unshare(NEWNS) != 0 or libc.mount(None, b"/", None, REC | PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "a private mount namespace for the baseline")


def mount(source, target, fstype, flags, data=None):
    args = [None if v is None else v.encode() for v in (source, target, fstype)]
    if libc.mount(*args, flags, None if data is None else data.encode()) != 0:
        raise OSError(ctypes.get_errno(), target)


def confine(work, uid):
    # What a sandbox process does to itself (reprorl.envs.sandbox.child), in raw system calls.
    if libc.unshare(NEWNET | NEWIPC) or libc.unshare(NEWNS):
        raise OSError(ctypes.get_errno(), "unshare")
    here = os.open(work, os.O_RDONLY)
    mount(None, "/", None, REC | PRIVATE)
    mount("tmpfs", "/tmp", "tmpfs", NOSUID | NODEV, "size=67108864,mode=1777")
    for scratch in ("/var/tmp", "/dev/shm"):
        if os.path.isdir(scratch) and os.path.realpath(scratch) != "/tmp":
            mount("/tmp", scratch, None, BIND)
    mount("proc", "/proc", "proc", NOSUID | NODEV | NOEXEC)
    for point in MOUNTS:
        if point not in ("/tmp", "/proc") and not point.startswith("/proc/"):
            try:
                mount(None, point, None, BIND | REMOUNT | RDONLY)
            except OSError:
                pass
    os.fchdir(here)
    resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS


def child(sock, work, uid):
    status = 1
    try:
        os.setsid()
        fd = sock.detach()  # the channel alone, as fd 3: never another episode's socket
        if fd != 3:
            os.dup2(fd, 3)
        os.closerange(4, 1 << 20)
        sock = socket.socket(fileno=3)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 26, 1 << 26))
        if CONFINED:
            confine(work, uid)
        while sock.recv(65536):
            time.sleep(LATENCY_S)
            sock.sendall(REPLY)
        status = 0
    finally:
        os._exit(status)  # never back into the parent's event loop, which this process copied


async def episode(i, gate, loop):
    async with gate:
        base = os.path.join(ROOT, f"s{i}")
        work = os.path.join(base, "work")
        uid = 3_000_000 + i + 1
        if CONFINED:  # the episode's directory and its bounded work filesystem, as the pool makes them
            os.mkdir(base, 0o711)
            os.mkdir(work, 0o700)
            mount("tmpfs", work, "tmpfs", NOSUID | NODEV, f"size=67108864,nr_inodes=4096,uid={uid},gid={uid}")
            libc.unshare(NEWPID)  # the next child is the init of a PID namespace of its own
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            ours.close()
            child(theirs, work, uid)
        if CONFINED:
            libc.setns(OWN_PID_NS, NEWPID)
        theirs.close()
        ours.setblocking(False)
        for _ in range(CALLS):
            await loop.sock_sendall(ours, REQUEST)
            assert await loop.sock_recv(ours, 65536) == REPLY
        ours.close()
        fd = os.pidfd_open(pid)
        if CONFINED:  # one SIGKILL to the namespace's init ends everything it started
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        ended = loop.create_future()
        loop.add_reader(fd, ended.set_result, None)
        await ended
        loop.remove_reader(fd)
        os.close(fd)
        os.waitpid(pid, 0)
        if CONFINED:
            libc.umount2(work.encode(), 2)
            shutil.rmtree(base)


async def main():
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(CONCURRENCY)
    await episode(-1, gate, loop)
    start = time.perf_counter()
    cpu = time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    await asyncio.gather(*[episode(i, gate, loop) for i in range(EPISODES)])
    rate = EPISODES / (time.perf_counter() - start)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = time.process_time() - cpu
    spent += reaped.ru_utime + reaped.ru_stime - children.ru_utime - children.ru_stime
    shutil.rmtree(ROOT)
    print(rate, spent / EPISODES)


asyncio.run(main())
"""


def baseline_rate(episodes: int, concurrency: int, calls: int, ms: int, mode: str) -> tuple[float, float]:
    """(episodes/s, CPU seconds per episode, its children's included) of the minimal baseline (module
    text) in `mode` ("bare" or "confined"), in a bare interpreter of its own."""
    argv = [
        sys.executable,
        "-I",
        "-c",
        BASELINE,
        str(episodes),
        str(concurrency),
        str(calls),
        str(ms / 1000),
        mode,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600)
    rate, cpu = done.stdout.split()[-2:]
    return float(rate), float(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--latency-ms", type=int, default=10)
    parser.add_argument("--warm", type=int, default=0, help="sandboxes the pool keeps opened ahead of demand")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="measure the pool and the baselines this many times, interleaved; the figures are the "
        "median round's (on a shared box one run's figure moves by a fifth)",
    )
    args = parser.parse_args()
    sys.modules.setdefault("envs", sys.modules["__main__"])
    rounds = []
    for _ in range(max(1, args.rounds)):
        elapsed, ok, failures, spent = asyncio.run(
            _run(args.episodes, args.concurrency, args.calls, args.latency_ms, args.warm)
        )
        bare = baseline_rate(args.episodes, args.concurrency, args.calls, args.latency_ms, "bare")
        # The same confinement as a sandbox gets here (namespaces and mounts need root).
        confined = (
            baseline_rate(args.episodes, args.concurrency, args.calls, args.latency_ms, "confined")
            if os.geteuid() == 0
            else None
        )
        rounds.append((elapsed, ok, failures, spent, bare, confined))

    # The median round by its ratio to the strictest baseline measured beside it.
    def ratio_of(r: tuple[Any, ...]) -> float:
        return float((args.episodes / r[0]) / (r[5] or r[4])[0])

    ordered = sorted(rounds, key=ratio_of)
    elapsed, ok, failures, spent, bare, confined = ordered[len(ordered) // 2]
    rate = args.episodes / elapsed
    bound = args.concurrency / (args.calls * args.latency_ms / 1000)
    peak = peak_rss_mib()
    print(
        f"rounds              {len(rounds)}; ratio to the {'confined' if confined else 'bare'} baseline: "
        + ", ".join(f"{ratio_of(r):.3f}" for r in rounds)
        + "; the median round's figures follow"
    )
    print(f"episodes            {args.episodes} ({ok} scored 1.0)")
    print(f"concurrency C       {args.concurrency}")
    print(f"tool calls/episode  {args.calls} x {args.latency_ms} ms")
    print(f"elapsed             {elapsed:.2f} s")
    print(f"episodes/s          {rate:.1f}")
    print(f"tool calls/s        {rate * args.calls:.1f}")
    print(f"bound C/(K*L)       {bound:.1f} episodes/s")
    print(f"ratio               {rate / bound:.3f}")
    total = sum(spent.values())
    print(f"CPU per episode     {total / args.episodes * 1000:.2f} ms")
    for name, seconds in spent.items():
        print(f"  {name:<22}{seconds / args.episodes * 1000:>7.2f} ms ({seconds / max(total, 1e-9):.0%})")
    print("minimal baselines (same run, a bare interpreter; fork, round trips over a socket pair, reap):")
    for name, figures in (("bare", bare), ("confined", confined)):
        if figures is None:
            print(f"  {name:<10} not run: its namespaces and mounts need root")
            continue
        print(
            f"  {name:<10}{figures[0]:>8.1f} episodes/s, {figures[1] * 1000:.2f} ms CPU per episode; "
            f"ratio to it {rate / figures[0]:.3f}"
        )
    print(f"peak RSS            {peak:,.0f} MiB (this process; the zygote and sandboxes are their own)")
    for reason, count in failures.most_common():
        print(f"not scored: {count} x {reason}")


if __name__ == "__main__":
    main()
