"""Bundles at scale: export, verify and import of a run with many rollouts, each phase's time and peak RSS.

A synthetic run of N rollouts (bench/records.py's realistic trajectories: T turns of K tokens with
logprobs, tool calls, rewards) is written through `RolloutWriter`, B rollouts per part file. Then,
each in a child process of its own so its peak RSS is its own: `export_bundle`, `read_bundle` (the
verifying pass `runs verify` starts with) and `import_bundle` into a fresh store. Memory must not
grow with N: every member is streamed, and only the manifest (one line per part file) is held.
Printed per phase: seconds, MB/s of bundle, peak RSS; and the bundle's size against the run's.

    python bench/portable.py [--rollouts 1000000] [--batch 10000] [--turns 2] [--tokens 16]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from records import trajectory
from rss import peak_rss_mib

from reprorl.hashing import content_hash
from reprorl.portable import export_bundle, import_bundle, read_bundle
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.store.rollouts import RolloutWriter


def write_run(home: Path, rollouts: int, batch: int, turns: int, tokens: int) -> str:
    rng = random.Random(0)
    store = Store(home)
    spec = {"bench": "portable"}
    record = RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name="bench", seeds={"g": 0})
    writer = RolloutWriter(record)
    written, step = 0, 0
    while written < rollouts:
        n = min(batch, rollouts - written)
        writer.write(step, [trajectory(record.run_id, written + j, turns, tokens, rng) for j in range(n)])
        written, step = written + n, step + 1
    store.close()
    return record.run_id


def phase(name: str, home: Path, run_id: str, bundle: Path, target: Path) -> dict[str, float]:
    """One phase in this process; returns its seconds and this process's peak RSS."""
    start = time.perf_counter()
    if name == "export":
        store = Store(home)
        export_bundle(store, run_id, bundle)
        store.close()
    elif name == "idle":
        pass  # the floor: a process that has imported reprorl and done nothing
    elif name == "verify":
        read_bundle(bundle)
    else:
        store = Store(target)
        import_bundle(store, bundle)
        assert RolloutStore(RunRecord(store, run_id)).count() > 0
        store.close()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_mib": peak_rss_mib()}


def child(name: str, home: Path, run_id: str, bundle: Path, target: Path) -> dict[str, float]:
    argv = [sys.executable, __file__, "--phase", name, str(home), run_id, str(bundle), str(target)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=3600)
    value: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return value


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--phase":
        _, _, name, home, run_id, bundle, target = sys.argv
        print(json.dumps(phase(name, Path(home), run_id, Path(bundle), Path(target))))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=10_000, help="rollouts per part file")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=16, help="sampled tokens per turn")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reprorl-portable-") as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        run_id = write_run(root / "home", args.rollouts, args.batch, args.turns, args.tokens)
        run_bytes = sum(p.stat().st_size for p in (root / "home" / "runs" / run_id).rglob("*") if p.is_file())
        print(
            f"run: {args.rollouts:,} rollouts ({args.turns} turns x {args.tokens} tokens) in "
            f"{-(-args.rollouts // args.batch)} part files, {run_bytes / 1e6:,.1f} MB, "
            f"written in {time.perf_counter() - start:.0f} s"
        )
        bundle_path = root / "run.tar"
        for name in ("idle", "export", "verify", "import"):
            figures = child(name, root / "home", run_id, bundle_path, root / "target")
            if name == "idle":
                floor = figures["peak_mib"]
                print(f"{name:<7} peak RSS {floor:>6.0f} MiB (a process that only imported reprorl)")
                continue
            size = bundle_path.stat().st_size
            print(
                f"{name:<7} {figures['seconds']:>7.1f} s  {size / 1e6 / figures['seconds']:>7.1f} MB/s  "
                f"peak RSS {figures['peak_mib']:>6.0f} MiB"
            )
        size = bundle_path.stat().st_size
        print(f"bundle {size / 1e6:,.1f} MB for a run folder of {run_bytes / 1e6:,.1f} MB")


if __name__ == "__main__":
    main()
