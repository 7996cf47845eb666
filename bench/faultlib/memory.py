"""Out of memory in the trainer: the run's address space capped while it trains, then --resume.

The cap (`RLIMIT_AS`, set on the running process from outside, as a container limit would bite)
sits a little above what the process has mapped once RL is under way, so the next large
allocation (a step's activations, the sampler's cache) is refused by the kernel. The run must stop
with one line that names memory and the resume, and the resumed run must end as an unbroken one.
"""

from __future__ import annotations

import random
import resource
import time

import psutil

from faultlib import Trial, fault
from faultlib.harness import Bench, progress_after, run_ids

RESUMED = frozenset({"resumed"})
HANG_S = 60.0


@fault("trainer out of memory", "the run's address space capped mid-run; a clear error, then --resume")
def out_of_memory(bench: Bench, trials: int, rng: random.Random) -> list[Trial]:
    reference = bench.reference("sync")
    spec, args = bench.spec("sync")
    results: list[Trial] = []
    for i in range(trials):
        home = bench.home(f"oom-{i}")
        proc = bench.start(home, "run", str(spec), *args)
        bench.await_event(home, proc, "checkpoint")  # the warm start is done: RL is under way
        time.sleep(rng.uniform(0.0, 0.3) * reference.duration_s)
        notes: list[str] = []
        capped_at = time.time()
        try:
            mapped = psutil.Process(proc.pid).memory_info().vms
            headroom = rng.choice([8, 32, 64]) << 20
            psutil.Process(proc.pid).rlimit(psutil.RLIMIT_AS, (mapped + headroom, resource.RLIM_INFINITY))
        except psutil.NoSuchProcess:
            notes.append("the run ended before the cap")
        # A refused allocation must end the run or be survived, never leave it waiting for ever.
        code = bench.finish(proc, timeout=HANG_S + 4 * reference.duration_s)
        lines = bench.log_of(proc).strip().splitlines()
        if bench.hung(proc):
            main = bench.stacks(proc).split("Thread ")[1:2]  # the main thread's frames, innermost first
            where = "; ".join(line.strip() for line in "".join(main).splitlines()[1:7])
            limit = HANG_S + 4 * reference.duration_s
            notes.append(f"hung under the cap: killed after {limit:.0f} s in {where}")
        elif code == 0:
            notes.append("no allocation was refused")
        elif lines and "ran out of memory" in lines[-1]:
            notes.append("stopped with one line naming memory and the resume")
        else:
            notes.append(f"exit {code}: {lines[-1][:160] if lines else '(no output)'}")
        if code != 0:
            resumed = bench.start(home, "run", "--resume", run_ids(home)[0], *args)
            if bench.finish(resumed) != 0:
                notes.append(f"resume failed: {bench.log_of(resumed).strip().splitlines()[-1:]}")
        recover = progress_after(bench.events(home), capped_at, RESUMED) if code != 0 else None
        results.append(bench.conclude(home, reference.outcome, notes, recover))
    return results
