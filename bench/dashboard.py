"""The dashboard's rollout table at scale: time to the first page and to filtered pages over N rollouts.

A run of N rollouts (default 1,000,000) is written through `RolloutWriter` in part files of P rows
(realistic records, from `bench/records.py`, at 2 turns of 16 tokens so that a million fit on disk).
The dashboard then serves it on 127.0.0.1 and each page is fetched over HTTP, as a browser would:
the first page, a page deep in the table, the CLI's SQL filter `termination='tool_timeout'`, a
quick filter (failed calls of one class) and a reward range. Each time is the median of R fetches
once the part files were verified (the first fetch, which verifies them, is printed on its own),
and is set against its bound measured in the same run: the same query on a bare DuckDB connection
over the same files, without the dashboard, HTTP or the verification cache. Target: < 1 s each.
Last, the run page's sections: built once from every rollout, then served from the cache.

    python bench/dashboard.py [--rollouts 1000000] [--part 10000] [--repeat 5] [--keep DIR]
"""

from __future__ import annotations

import argparse
import functools
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from records import trajectory

from reprorl import DashboardServer
from reprorl.hashing import content_hash
from reprorl.store import RunRecord, Store
from reprorl.store.rollouts import RolloutWriter

TEMPLATES = 1_000  # distinct records, re-used under new ids: building each one costs more than writing it
COLUMNS = "step, rollout_id, split, task_id, termination, reward_total, n_turns, n_tool_calls, tool_outcomes"


def write_run(store: Store, rollouts: int, part: int) -> tuple[RunRecord, float]:
    spec = {"name": "dashboard-bench"}
    record = RunRecord.create(
        store, spec=spec, spec_hash=content_hash(spec), name="dashboard-bench", seeds={"run": 0}
    )
    rng = random.Random(0)
    templates = [trajectory(record.run_id, i, 2, 16, rng, batch_size=4) for i in range(TEMPLATES)]
    writer = RolloutWriter(record)
    start = time.perf_counter()
    for step, first in enumerate(range(0, rollouts, part)):
        rows = []
        for i in range(first, min(first + part, rollouts)):
            base = templates[i % TEMPLATES]
            rows.append(
                base.model_copy(
                    update={
                        "rollout_id": f"{record.run_id}/{i:07d}",
                        "step": step,
                        "task_id": f"sql-{i % 5000}",
                    }
                )
            )
        writer.write(step, rows)
        print(f"\r  wrote {min(first + part, rollouts):,} / {rollouts:,} rollouts", end="", flush=True)
    print()
    record.set_status("succeeded")
    return record, time.perf_counter() - start


def fetch(client: httpx.Client, url: str) -> float:
    start = time.perf_counter()
    reply = client.get(url)
    elapsed = time.perf_counter() - start
    if reply.status_code != 200:
        raise SystemExit(f"{url}: {reply.status_code} {reply.text[:300]}")
    return elapsed


def median_of(repeat: int, fn: Callable[[], float]) -> float:
    return statistics.median(fn() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1_000_000)
    parser.add_argument("--part", type=int, default=10_000, help="rollouts per part file")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="write the store here and keep it (default: a temp dir)")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="reprorl-dashboard-bench-"))
    store = Store(root)
    try:
        record, write_s = write_run(store, args.rollouts, args.part)
        parts = sorted(record.path.glob("rollouts/step=*/part-*.parquet"))
        size = sum(p.stat().st_size for p in parts)
        print(
            f"{args.rollouts:,} rollouts in {len(parts)} part files, {size / 2**20:,.0f} MiB, "
            f"written in {write_s:.0f} s"
        )
        run = record.run_id
        pages = {
            "first page": (f"/runs/{run}/rollouts", None),
            "page 10,000 (deep)": (f"/runs/{run}/rollouts?page=10000", "OFFSET 499950"),
            "SQL termination='tool_timeout'": (
                f"/runs/{run}/rollouts?where=termination%3D%27tool_timeout%27",
                "WHERE termination = 'tool_timeout'",
            ),
            "quick filter failure=tool_timeout": (
                f"/runs/{run}/rollouts?failure=tool_timeout",
                "WHERE list_contains(tool_outcomes, 'tool_timeout')",
            ),
            "reward in [0.5, 1]": (
                f"/runs/{run}/rollouts?reward_min=0.5&reward_max=1",
                "WHERE reward_total >= 0.5 AND reward_total <= 1",
            ),
        }
        files = "[" + ", ".join(f"'{p}'" for p in parts) + "]"
        with (
            DashboardServer(store, decode_tokens=False) as server,
            httpx.Client(base_url=server.url, timeout=600) as client,
        ):
            cold = fetch(client, pages["first page"][0])
            print(f"first page, cold (verifies every part file once): {cold:.2f} s")
            print(f"{'page':36} {'dashboard s':>12} {'bare DuckDB s':>14} {'ratio':>6}")
            for name, (url, clause) in pages.items():
                served = median_of(args.repeat, functools.partial(fetch, client, url))
                con = duckdb.connect()
                tail = clause if clause and clause.startswith("OFFSET") else ""
                where = clause if clause and clause.startswith("WHERE") else ""
                sql = (
                    f"SELECT {COLUMNS} FROM read_parquet({files}) {where} "
                    f"ORDER BY step, rollout_id LIMIT 50 {tail}"
                )
                count = f"SELECT count(*) FROM read_parquet({files}) {where}"

                def bare(sql: str = sql, count: str = count, con: duckdb.DuckDBPyConnection = con) -> float:
                    start = time.perf_counter()
                    con.execute(count).fetchall()
                    con.execute(sql).fetchall()
                    return time.perf_counter() - start

                bound = median_of(args.repeat, bare)
                con.close()
                verdict = "ok" if served < 1.0 else "OVER 1 s"
                print(f"{name:36} {served:12.3f} {bound:14.3f} {served / bound:6.1f}  {verdict}")
            # The run page's sections read every rollout once (the report's curves need them all);
            # a page asking again gets them from the cache until the run's records change.
            built = fetch(client, f"/api/runs/{run}/sections")
            cached = median_of(args.repeat, lambda: fetch(client, f"/api/runs/{run}/sections"))
            print(f"run page sections: built in {built:.2f} s, then {cached:.3f} s from the cache")
    finally:
        store.close()
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
