"""SIGKILL of the whole run at a random point, then `--resume`: in each mode, and of one Ray actor.

A kill-and-resume trial draws its point uniformly over the reference run's working time (from its
record appearing to its end), counted from when the killed process's record appears, so kills fall
in the warm start, steps, eval points, checkpoint writes and the final save alike. A draw that comes
after the run already ended is drawn again.
"""

from __future__ import annotations

import os
import random
import signal
import time

from faultlib import Trial, fault
from faultlib.harness import Bench, progress_after, run_ids

RESUMED = frozenset({"resumed"})


def kill_and_resume(bench: Bench, mode: str, trials: int, rng: random.Random) -> list[Trial]:
    reference = bench.reference(mode)
    spec, args = bench.spec(mode)
    results: list[Trial] = []
    while len(results) < trials:
        home = bench.home(f"{mode}-kill-{len(results)}")
        proc = bench.start(home, "run", str(spec), *args)
        bench.await_record(home, proc)
        time.sleep(rng.uniform(0.0, 1.0) * reference.duration_s)
        if not bench.kill_unfinished(home, proc):  # it ended before the kill: draw again
            continue
        killed_at = time.time()
        notes: list[str] = []
        runs = run_ids(home)
        if not runs:
            raise RuntimeError(f"{mode}: the killed run left no record")
        resumed = bench.start(home, "run", "--resume", runs[0], *args)
        code = bench.finish(resumed)
        events = bench.events(home)
        if code != 0:
            notes.append(f"resume exit {code}: {bench.log_of(resumed).strip().splitlines()[-1:]}")
        if any(
            e.get("event") == "buffers_restored" and (e.get("batches") or e.get("groups")) for e in events
        ):
            notes.append("resumed with sampled batches buffered ahead")
        results.append(
            bench.conclude(home, reference.outcome, notes, progress_after(events, killed_at, RESUMED))
        )
    return results


@fault("kill-resume sync", "SIGKILL of the run at a random point, then --resume (synchronous)")
def sync(bench: Bench, trials: int, rng: random.Random) -> list[Trial]:
    return kill_and_resume(bench, "sync", trials, rng)


@fault("kill-resume async", "the same, samples buffered up to 2 versions ahead (max_staleness 2)")
def asynchronous(bench: Bench, trials: int, rng: random.Random) -> list[Trial]:
    return kill_and_resume(bench, "async", trials, rng)


@fault("kill-resume ray", "the same, trainer and 2 rollout workers as Ray actors (--ray local)")
def on_ray(bench: Bench, trials: int, rng: random.Random) -> list[Trial]:
    return kill_and_resume(bench, "ray", trials, rng)


def _actor_pids(events: list[dict[str, object]], kind: str) -> list[int]:
    if kind == "trainer":
        return [int(e["pid"]) for e in events if e.get("event") == "trainer_actor" and "pid" in e]  # type: ignore[call-overload]
    pids: list[int] = []
    for e in events:
        if e.get("event") == "rollout_workers" and e.get("backend") == "ray":
            pids += [int(w["pid"]) for w in e.get("workers", [])]  # type: ignore[attr-defined]
    return pids


@fault("ray rollout worker", "SIGKILL of one Ray rollout worker's process mid-run; the run goes on")
def ray_worker(bench: Bench, trials: int, rng: random.Random) -> list[Trial]:
    reference = bench.reference("ray")
    spec, args = bench.spec("ray")
    results: list[Trial] = []
    for i in range(trials):
        home = bench.home(f"ray-worker-{i}")
        proc = bench.start(home, "run", str(spec), *args)
        # Once the workers run, a random moment of the reference's time from there to its end.
        bench.await_event(home, proc, "rollout_workers", backend="ray")
        time.sleep(rng.uniform(0.0, 0.8) * reference.span("rollout_workers", "adapter_saved"))
        pids = _actor_pids(bench.events(home), "workers")
        notes: list[str] = []
        killed_at = time.time()
        if proc.poll() is None and pids:
            victim = rng.choice(pids)
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                notes.append("the worker had already exited")
        else:
            notes.append("the run ended before the kill")
        code = bench.finish(proc)
        events = bench.events(home)
        if code != 0:
            notes.append(f"exit {code}: {bench.log_of(proc).strip().splitlines()[-1:]}")
        if any(e.get("event") == "rollout_workers_lost" for e in events):
            notes.append("worker loss recorded")
        results.append(bench.conclude(home, reference.outcome, notes, progress_after(events, killed_at)))
    return results


@fault("ray trainer actor", "SIGKILL of the Ray trainer actor's process; the run fails, --resume finishes it")
def ray_trainer(bench: Bench, trials: int, rng: random.Random) -> list[Trial]:
    reference = bench.reference("ray")
    spec, args = bench.spec("ray")
    results: list[Trial] = []
    for i in range(trials):
        home = bench.home(f"ray-trainer-{i}")
        proc = bench.start(home, "run", str(spec), *args)
        bench.await_event(home, proc, "trainer_actor")
        time.sleep(rng.uniform(0.0, 0.6) * reference.duration_s)
        notes: list[str] = []
        killed_at = time.time()
        if proc.poll() is None:
            os.kill(_actor_pids(bench.events(home), "trainer")[0], signal.SIGKILL)
        else:
            notes.append("the run ended before the kill")
        code = bench.finish(proc)
        last = bench.log_of(proc).strip().splitlines()[-1:]
        if code != 0:
            notes.append(
                "the run failed naming the dead actor" if "actor" in str(last) else f"exit {code}: {last}"
            )
            bench.finish(bench.start(home, "run", "--resume", run_ids(home)[0], *args))
        recover = progress_after(bench.events(home), killed_at, RESUMED)
        results.append(bench.conclude(home, reference.outcome, notes, recover))
    return results
