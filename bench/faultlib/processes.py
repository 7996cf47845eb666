"""Helper processes of a run killed under it: the sandbox zygote mid-episode, and the verifier pool.

Neither is the run's own process, so the run must carry on by itself: a new zygote forks the next
sandboxes (running ones keep working), and a verifier call whose worker died goes to a fresh one.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time

import psutil

from faultlib import Trial, fault
from faultlib.harness import Bench, progress_after

ZYGOTE = "reprorl.envs.sandbox.worker"
VERIFIER = "reprorl.rewards.worker"


def helpers(proc: subprocess.Popen[bytes], module: str, *, direct: bool) -> list[psutil.Process]:
    """The run's processes started as `python -m module` (only its own children with `direct`:
    sandboxes are forks of the zygote and carry its command line)."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        try:
            if module in " ".join(child.cmdline()) and (not direct or child.ppid() == proc.pid):
                found.append(child)
        except psutil.Error:
            pass
    return found


def _kill_helpers(
    bench: Bench, name: str, module: str, trials: int, rng: random.Random, *, direct: bool
) -> list[Trial]:
    reference = bench.reference("sync")
    spec, args = bench.spec("sync")
    results: list[Trial] = []
    for i in range(trials):
        home = bench.home(f"{name}-{i}")
        proc = bench.start(home, "run", str(spec), *args)
        # Once RL sampling is under way (the warm start's checkpoint is written), a random moment.
        bench.await_event(home, proc, "checkpoint")
        time.sleep(rng.uniform(0.0, 0.5) * reference.duration_s)
        notes: list[str] = []
        victims = helpers(proc, module, direct=direct)
        killed_at = time.time()
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim.pid, signal.SIGKILL)
        if not victims:
            notes.append("nothing to kill: the run had ended" if proc.poll() is not None else "none running")
        code = bench.finish(proc)
        if code != 0:
            notes.append(f"exit {code}: {bench.log_of(proc).strip().splitlines()[-1:]}")
        recover = progress_after(bench.events(home), killed_at)
        results.append(bench.conclude(home, reference.outcome, notes, recover))
    return results


@fault("sandbox zygote", "SIGKILL of the sandbox zygote while episodes run")
def zygote(bench: Bench, trials: int, rng: random.Random) -> list[Trial]:
    return _kill_helpers(bench, "zygote", ZYGOTE, trials, rng, direct=True)


@fault("verifier pool", "SIGKILL of every verifier worker process mid-run")
def verifier_pool(bench: Bench, trials: int, rng: random.Random) -> list[Trial]:
    return _kill_helpers(bench, "verifiers", VERIFIER, trials, rng, direct=False)
