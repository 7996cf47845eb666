"""Concurrent episodes against slow tools: throughput against the concurrency bound C / latency.

C episodes run at once; each makes K tool calls that each take L seconds inside its sandbox
(a real sleep in the sandboxed process), then answers. If nothing but the tools took time,
the rate would be C / (K * L) episodes per second; the printed ratio says how close the env
layer (sandbox per episode, IPC, verifier, records) comes to that bound.

The machine has its own bound below that one, measured in the same run: a minimal baseline of the
same work shape in a bare interpreter (asyncio, no reprorl): per episode, fork a child that sets
its own session and resource limits, make K request/response round trips over a socket pair with
the child sleeping L per request, and reap it (by pidfd, off the event loop's critical path). The
ratio to it says how much of what the machine can do the env layer uses.

    python bench/envs.py [--episodes 256] [--concurrency 256] [--calls 4] [--latency-ms 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
from rss import peak_rss_mib

from reprorl.actions import render_call
from reprorl.envs import ToolEnv, tool
from reprorl.envs.sandbox import SandboxPool
from reprorl.rewards import FinalState, Verifier, VerifierRunner
from reprorl.rollout import EpisodeIds, ScriptedPolicy, run_episode
from reprorl.types import Message, Permission, Role, Task


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
    episodes: int, concurrency: int, calls: int, ms: int
) -> tuple[float, int, Counter[str], dict[str, float]]:
    task = Task(id="t", family="slow", prompt=(Message(role=Role.USER, content="go"),), tools=("lookup",))
    gate = asyncio.Semaphore(concurrency)
    async with (
        SandboxPool(
            [__name__ if __name__ != "__main__" else "envs"],
            sys_path=[Path(__file__).parent],
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

        await one(-1)  # warm up the zygote and the verifier pool
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
import asyncio, os, resource, socket, sys, time

EPISODES, CONCURRENCY, CALLS = map(int, sys.argv[1:4])
LATENCY_S = float(sys.argv[4])
REQUEST = b'{"tool": "lookup", "arguments": {"ms": 10}, "id": "call-0"}'
REPLY = b'{"ok": true, "value": "ok", "duration_s": 0.01}'


def child(sock):
    os.setsid()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 26, 1 << 26))
    while sock.recv(65536):
        time.sleep(LATENCY_S)
        sock.sendall(REPLY)
    os._exit(0)


async def episode(gate, loop):
    async with gate:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            ours.close()
            child(theirs)
        theirs.close()
        ours.setblocking(False)
        for _ in range(CALLS):
            await loop.sock_sendall(ours, REQUEST)
            assert await loop.sock_recv(ours, 65536) == REPLY
        ours.close()
        fd = os.pidfd_open(pid)
        ended = loop.create_future()
        loop.add_reader(fd, ended.set_result, None)
        await ended
        loop.remove_reader(fd)
        os.close(fd)
        os.waitpid(pid, 0)


async def main():
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(CONCURRENCY)
    await episode(gate, loop)
    start = time.perf_counter()
    cpu = time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    await asyncio.gather(*[episode(gate, loop) for _ in range(EPISODES)])
    rate = EPISODES / (time.perf_counter() - start)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = time.process_time() - cpu
    spent += reaped.ru_utime + reaped.ru_stime - children.ru_utime - children.ru_stime
    print(rate, spent / EPISODES)


asyncio.run(main())
"""


def baseline_rate(episodes: int, concurrency: int, calls: int, ms: int) -> tuple[float, float]:
    """(episodes/s, CPU seconds per episode, its children's included) of the minimal baseline (module
    text), in a bare interpreter of its own."""
    argv = [sys.executable, "-I", "-c", BASELINE, str(episodes), str(concurrency), str(calls), str(ms / 1000)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600)
    rate, cpu = done.stdout.split()[-2:]
    return float(rate), float(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--latency-ms", type=int, default=10)
    args = parser.parse_args()
    sys.modules.setdefault("envs", sys.modules["__main__"])
    elapsed, ok, failures, spent = asyncio.run(
        _run(args.episodes, args.concurrency, args.calls, args.latency_ms)
    )
    rate = args.episodes / elapsed
    bound = args.concurrency / (args.calls * args.latency_ms / 1000)
    peak = peak_rss_mib()
    machine, machine_cpu = baseline_rate(args.episodes, args.concurrency, args.calls, args.latency_ms)
    print(f"episodes            {args.episodes} ({ok} scored 1.0)")
    print(f"concurrency C       {args.concurrency}")
    print(f"tool calls/episode  {args.calls} x {args.latency_ms} ms")
    print(f"elapsed             {elapsed:.2f} s")
    print(f"episodes/s          {rate:.1f}")
    print(f"tool calls/s        {rate * args.calls:.1f}")
    print(f"bound C/(K*L)       {bound:.1f} episodes/s")
    print(f"ratio               {rate / bound:.3f}")
    print(f"minimal baseline    {machine:.1f} episodes/s (fork, {args.calls} round trips, reap; same run)")
    print(f"ratio to baseline   {rate / machine:.3f}")
    print(f"peak RSS            {peak:,.0f} MiB (this process; the zygote and sandboxes are their own)")
    total = sum(spent.values())
    print(f"CPU per episode     {total / args.episodes * 1000:.2f} ms; baseline {machine_cpu * 1000:.2f} ms")
    for name, seconds in spent.items():
        print(f"  {name:<22}{seconds / args.episodes * 1000:>7.2f} ms ({seconds / max(total, 1e-9):.0%})")
    for reason, count in failures.most_common():
        print(f"not scored: {count} x {reason}")


if __name__ == "__main__":
    main()
