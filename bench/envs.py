"""Concurrent episodes against slow tools: throughput against the concurrency bound C / latency.

C episodes run at once; each makes K tool calls that each take L seconds inside its sandbox
(a real sleep in the sandboxed process), then answers. If nothing but the tools took time,
the rate would be C / (K * L) episodes per second; the printed ratio says how close the env
layer (sandbox per episode, IPC, verifier, records) comes to that bound.

    python bench/envs.py [--episodes 256] [--concurrency 256] [--calls 4] [--latency-ms 10]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

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


async def _run(episodes: int, concurrency: int, calls: int, ms: int) -> tuple[float, int, Counter[str]]:
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
        start = time.perf_counter()
        ok = await asyncio.gather(*[one(i) for i in range(episodes)])
        return time.perf_counter() - start, sum(ok), failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--latency-ms", type=int, default=10)
    args = parser.parse_args()
    sys.modules.setdefault("envs", sys.modules["__main__"])
    elapsed, ok, failures = asyncio.run(_run(args.episodes, args.concurrency, args.calls, args.latency_ms))
    rate = args.episodes / elapsed
    bound = args.concurrency / (args.calls * args.latency_ms / 1000)
    print(f"episodes            {args.episodes} ({ok} scored 1.0)")
    print(f"concurrency C       {args.concurrency}")
    print(f"tool calls/episode  {args.calls} x {args.latency_ms} ms")
    print(f"elapsed             {elapsed:.2f} s")
    print(f"episodes/s          {rate:.1f}")
    print(f"tool calls/s        {rate * args.calls:.1f}")
    print(f"bound C/(K*L)       {bound:.1f} episodes/s")
    print(f"ratio               {rate / bound:.3f}")
    for reason, count in failures.most_common():
        print(f"not scored: {count} x {reason}")


if __name__ == "__main__":
    main()
