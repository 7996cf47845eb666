"""Load: a thousand episodes at once against 10 ms tools, every record written and counted back.

C episodes of a scripted policy run concurrently, each in a sandbox of its own, each making K
calls of a tool that sleeps L ms inside its sandbox, then scored by the verifier pool. Each
finished trajectory goes to a real run's rollout store in parts of `--part` rollouts (as a
training step writes them). The bench prints the throughput against the bound C / (K * L), what
did not score and why, the records counted back from the store against the episodes started
(target: none lost), and the peak resident memory of the whole process tree (this process, the
zygote, the sandboxes and the verifier workers), sampled every 100 ms.

    python bench/load.py [--episodes 1000] [--concurrency 1000] [--calls 4] [--latency-ms 10]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))

import envs  # the slow tool, its env and verifier: bench/envs.py
from reprorl.envs.sandbox import SandboxPool
from reprorl.hashing import content_hash
from reprorl.rewards import VerifierRunner
from reprorl.rollout import EpisodeIds, ScriptedPolicy, run_episode
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.store.rollouts import RolloutWriter
from reprorl.types import Message, Role, Task, Trajectory


class TreeRss:
    """The largest summed RSS of this process and all its descendants (shared pages counted in
    each, so an upper bound), and the largest rise of the machine's memory in use over its level
    before (what the tree really costs), sampled on a thread."""

    def __init__(self, every_s: float = 0.1) -> None:
        self.every_s, self.peak, self.processes = every_s, 0, 0
        self.before = self._in_use()
        self.rise = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    @staticmethod
    def _in_use() -> int:
        memory = psutil.virtual_memory()
        return int(memory.total - memory.available)

    def _watch(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total, count = 0, 0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    total += proc.memory_info().rss
                    count += 1
                except psutil.Error:
                    pass
            self.peak, self.processes = max(self.peak, total), max(self.processes, count)
            self.rise = max(self.rise, self._in_use() - self.before)
            self._stop.wait(self.every_s)

    def __enter__(self) -> TreeRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


async def _run(args: argparse.Namespace, record: RunRecord) -> tuple[float, int, Counter[str]]:
    task = Task(id="t", family="slow", prompt=(Message(role=Role.USER, content="go"),), tools=("lookup",))
    gate = asyncio.Semaphore(args.concurrency)
    writer = RolloutWriter(record)
    finished: list[Trajectory] = []
    failures: Counter[str] = Counter()
    written = 0

    def flush(step: int) -> None:
        nonlocal written
        batch, finished[:] = list(finished), []
        if batch:
            writer.write(step, batch)
            written += len(batch)

    async with (
        SandboxPool(["envs"], sys_path=[Path(__file__).parent]) as pool,
        VerifierRunner() as verifiers,
    ):

        async def one(i: int) -> None:
            async with gate:
                t = await run_episode(
                    envs.SlowEnv(),
                    task,
                    ScriptedPolicy(task, envs._script(args.calls, args.latency_ms)),
                    verifier=envs.Always(),
                    sandboxes=pool,
                    verifiers=verifiers,
                    ids=EpisodeIds(record.run_id, f"{record.run_id}/load/{i}"),
                )
            if t.reward is None or t.reward.total != 1.0:
                failures[f"{t.termination.value} {t.error or ''}"[:120]] += 1
            finished.append(t)
            if len(finished) >= args.part:
                flush(i)

        start = time.perf_counter()
        await asyncio.gather(*[one(i) for i in range(args.episodes)])
        elapsed = time.perf_counter() - start
        flush(args.episodes)
    return elapsed, written, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--latency-ms", type=int, default=10)
    parser.add_argument("--part", type=int, default=100, help="Rollouts per part file written.")
    args = parser.parse_args()
    # Every episode holds a socket to its sandbox: a thousand of them need more than the usual 1,024 fds.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 8 * args.concurrency + 256)), hard))
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "home")
        spec = {"bench": "load"}
        record = RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name="load", seeds={})
        with TreeRss() as rss:
            elapsed, written, failures = asyncio.run(_run(args, record))
        counted = RolloutStore(record).count()
        store.close()
    rate = args.episodes / elapsed
    bound = args.concurrency / (args.calls * args.latency_ms / 1000)
    print(f"episodes            {args.episodes} at once (concurrency {args.concurrency})")
    print(f"tool calls/episode  {args.calls} x {args.latency_ms} ms")
    print(f"elapsed             {elapsed:.2f} s ({rate:.1f} episodes/s; bound C/(K*L) {bound:.0f}/s)")
    print(f"scored 1.0          {args.episodes - sum(failures.values())}")
    for reason, count in failures.most_common():
        print(f"  not scored: {count} x {reason}")
    print(f"records             {written} written, {counted} counted back, {args.episodes - counted} lost")
    print(f"peak RSS            {rss.peak / 2**20:,.0f} MiB summed over {rss.processes} processes at most")
    print(f"peak memory in use  {rss.rise / 2**20:,.0f} MiB above the machine's level before the run")


if __name__ == "__main__":
    main()
