"""Faults under the store: a full disk, damaged records found on resume, the PostgreSQL registry restarted.

The disk is a tmpfs mounted for the trial with room for only part of the run (root is needed to
mount it); damage is a flipped byte in a rollout part or in a metrics line, or a torn last metrics
line, left by hand in a killed run before its resume; the registry is a throwaway PostgreSQL
cluster stopped and started again while the run goes on.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from pathlib import Path

from faultlib import Trial, fault
from faultlib.harness import Bench, progress_after, run_ids, stamp
from faultlib.postgres import Cluster

RESUMED = frozenset({"resumed"})


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _last_line(bench: Bench, proc: subprocess.Popen[bytes]) -> str:
    lines = bench.log_of(proc).strip().splitlines()
    return lines[-1] if lines else ""


@fault("disk full", "the store on a tmpfs with room for part of the run; space freed, then --resume")
def disk_full(bench: Bench, trials: int, rng: random.Random) -> list[Trial]:
    reference = bench.reference("sync")
    spec, args = bench.spec("sync")
    base = _size(bench.template)
    growth = max(_size(bench.root / f"reference-{spec.stem}") - base, 1 << 20)
    results: list[Trial] = []
    for i in range(trials):
        mount = bench.root / f"disk-{i}"
        mount.mkdir(exist_ok=True)
        room = base + int(rng.uniform(0.25, 0.9) * growth)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={room}", "tmpfs", str(mount)], check=True)
        notes: list[str] = []
        try:
            home = bench.home("home", at=mount)
            proc = bench.start(home, "run", str(spec), *args)
            code = bench.finish(proc)
            line = _last_line(bench, proc)
            freed_at = time.time()
            if code == 0:
                notes.append("the run fitted: no write failed")
            elif "ran out of disk space" in line and len(bench.log_of(proc).strip().splitlines()) <= 2:
                notes.append("refused in one line naming the disk and the resume")
            else:
                notes.append(f"exit {code}: {line[:160]}")
            subprocess.run(["mount", "-o", "remount,size=2g", str(mount)], check=True)
            if code != 0:
                runs = run_ids(home)
                if runs:
                    resumed = bench.start(home, "run", "--resume", runs[0], *args)
                    if bench.finish(resumed) != 0:
                        notes.append(f"resume failed: {_last_line(bench, resumed)[:160]}")
                else:  # nothing was recorded: the run is simply started again
                    notes.append("full before the run's record: started again")
                    bench.finish(bench.start(home, "run", str(spec), *args))
            recover = progress_after(bench.events(home), freed_at, RESUMED) if code != 0 else None
            results.append(bench.conclude(home, reference.outcome, notes, recover))
        finally:
            subprocess.run(["umount", "-l", str(mount)], check=False)
            shutil.rmtree(mount, ignore_errors=True)
    return results


def _flip_part(home: Path, rng: random.Random) -> str:
    from reprorl.store.rollouts import find_parts

    (run,) = run_ids(home)
    parts = find_parts(home / "runs" / run)
    path, step, _ = rng.choice(parts)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return f"a part of step {step} damaged"


def _damage_metrics(home: Path, rng: random.Random) -> str:
    (run,) = run_ids(home)
    metrics = home / "runs" / run / "metrics.jsonl"
    data = metrics.read_bytes()
    lines = data.splitlines(keepends=True)
    if rng.random() < 0.5 or len(lines) < 2:  # the last line torn mid-write
        last = lines[-1]
        metrics.write_bytes(data[: len(data) - len(last) + rng.randrange(1, max(len(last) - 1, 2))])
        return "the last metrics line torn"
    index = rng.randrange(len(lines))  # an earlier line changed in place
    line = bytearray(lines[index])
    line[rng.randrange(1, len(line) - 2)] ^= 0x02
    lines[index] = bytes(line)
    metrics.write_bytes(b"".join(lines))
    return f"metrics line {index + 1} of {len(lines)} altered"


def _damaged_on_resume(bench: Bench, trials: int, rng: random.Random, name: str, damage) -> list[Trial]:  # type: ignore[no-untyped-def]
    reference = bench.reference("sync")
    spec, args = bench.spec("sync")
    results: list[Trial] = []
    while len(results) < trials:
        home = bench.home(f"{name}-{len(results)}")
        proc = bench.start(home, "run", str(spec), *args)
        # Killed at a random point once it has written rollouts (something to damage).
        bench.await_event(home, proc, "rollouts_written")
        time.sleep(rng.uniform(0.0, 0.7) * reference.duration_s)
        if not bench.kill_unfinished(home, proc):  # it ended before the kill: draw again
            continue
        notes = [damage(home, rng)]
        damaged_at = time.time()
        resumed = bench.start(home, "run", "--resume", run_ids(home)[0], *args)
        if bench.finish(resumed) != 0:
            notes.append(f"resume failed: {_last_line(bench, resumed)[:160]}")
        events = bench.events(home)
        if any(e.get("event") == "records_damaged" for e in events):
            notes.append("the damage was found and named on resume")
        recover = progress_after(events, damaged_at, RESUMED)
        results.append(bench.conclude(home, reference.outcome, notes, recover))
    return results


@fault("corrupt rollout part", "a killed run's rollout part with a flipped bit, found on --resume")
def corrupt_part(bench: Bench, trials: int, rng: random.Random) -> list[Trial]:
    return _damaged_on_resume(bench, trials, rng, "corrupt-part", _flip_part)


@fault("torn or altered metrics line", "a killed run's metrics line torn or altered, found on --resume")
def torn_metrics(bench: Bench, trials: int, rng: random.Random) -> list[Trial]:
    return _damaged_on_resume(bench, trials, rng, "torn-metrics", _damage_metrics)


@fault("postgres restarted", "the PostgreSQL registry stopped for 1-6 s and started again mid-run")
def postgres_restart(bench: Bench, trials: int, rng: random.Random) -> list[Trial]:
    reference = bench.reference("sync")
    spec, args = bench.spec("sync")
    results: list[Trial] = []
    with Cluster(bench.root / "pg") as cluster:
        for i in range(trials):
            url = cluster.database(f"trial{i}")
            home = bench.home(f"pg-{i}", registry=url)
            proc = bench.start(home, "--db-url", url, "run", str(spec), *args)
            bench.await_record(home, proc)
            # Late in the run, where the registry is written: the run's end and its adapter.
            time.sleep(rng.uniform(0.4, 1.0) * reference.duration_s)
            down = rng.uniform(1.0, 6.0)
            cluster.stop()
            time.sleep(down)
            ended_while_down = proc.poll() is not None
            cluster.start()
            back_at = time.time()
            code = bench.finish(proc)
            notes = [f"exit {code}: {_last_line(bench, proc)[:160]}"] if code != 0 else []
            if ended_while_down:
                notes.append("the run had ended before the server came back")
            # The registry is written once the last step is checkpointed (status, the adapter):
            # a run that got there while the server was down waited for it.
            last = [stamp(e) for e in bench.events(home) if e.get("event") == "checkpoint"]
            if code == 0 and last and max(last) < back_at:
                notes.append("reached the registry while the server was down, waited, and went on")
            elif code == 0:
                notes.append("went on across the restart (the registry was not needed while down)")
            recover = progress_after(bench.events(home), back_at) if code == 0 else None
            results.append(bench.conclude(home, reference.outcome, notes, recover, registry=url))
    return results
