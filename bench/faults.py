"""Fault injection: each fault a run can meet, injected into real runs, and what the record kept.

For every fault it prints the trials; the runs that finished; the runs bit-identical to a reference
run of the same spec with no fault (every metric, sampled token, logprob, reward and the adapter);
the runs whose every rollout has the reference's sampled tokens, reward and end; the reference's
records missing from the faulted runs (rollouts and metric lines; target 0); and the time from the
fault to the run's next record of progress (for a kill, to its resume being back at work; for the
inference server, the extra wall time per injected failure). The faults are in `bench/faultlib/`
and register by name; `--faults` picks some. The disk-full fault mounts a tmpfs and needs root;
the PostgreSQL one needs Debian's postgresql.

    python bench/faults.py [--trials 20] [--other-trials 3] [--faults NAME ...] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from faultlib import Row, load_faults, summarise
from faultlib.harness import Bench

FAULTS = load_faults()
KILL_RESUME = ("kill-resume sync", "kill-resume async", "kill-resume ray")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_table(rows: list[Row]) -> None:
    head = f"{'fault':<30} {'trials':>6} {'finished':>8} {'identical':>9} {'same tokens':>11} {'lost':>5}"
    print(f"{head} {'recover s (median/max)':>23}")
    for row in rows:
        recover = f"{_fmt(row.recover_median_s)} / {_fmt(row.recover_max_s)}"
        counts = f"{row.trials:>6} {row.finished:>8} {row.identical:>9} {row.same_tokens:>11} {row.lost:>5}"
        print(f"{row.fault:<30} {counts} {recover:>23}")
    for row in rows:
        for note, count in sorted(row.notes.items()):
            print(f"  {row.fault}: {count} x {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="Kill-and-resume trials per mode.")
    parser.add_argument("--other-trials", type=int, default=3, help="Trials of every other fault.")
    parser.add_argument("--faults", nargs="*", choices=sorted(FAULTS), help="Only these faults.")
    parser.add_argument("--seed", type=int, default=20261204)
    parser.add_argument(
        "--scratch", type=Path, help="Where the trials' stores go (a temp folder by default)."
    )
    parser.add_argument("--out", type=Path, help="Also write the rows here as JSON.")
    args = parser.parse_args()

    names = args.faults or [*KILL_RESUME, *(n for n in FAULTS if n not in KILL_RESUME)]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="reprorl-faults-") as scratch:
        bench = Bench(args.scratch or Path(scratch), seed=args.seed)
        for name in names:
            trials = args.trials if name in KILL_RESUME else args.other_trials
            started = time.perf_counter()
            found = FAULTS[name].run(bench, trials, random.Random(f"{args.seed}/{name}"))
            rows.append(summarise(name, found))
            print(f"[{time.perf_counter() - started:6.0f} s] {name}: {FAULTS[name].what}", flush=True)
    print()
    print_table(rows)
    if args.out:
        args.out.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")


if __name__ == "__main__":
    main()
