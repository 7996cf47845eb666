"""The trainer as a Ray actor: the run's controller and learner placed on the cluster, not in the CLI.

`reprorl run --ray ADDRESS` writes the run record here (so a leak or a bad spec is refused before
anything starts on the cluster), then hands the run to a `TrainerActor` — a process of its own,
placed wherever its resources are (`--trainer-gpus`) — which trains it with its rollout workers as
further actors. This process follows the run through its records, the same files any other reader
sees, and shows its progress. Every process reads and writes the one store: on a real cluster, a
shared folder and the same registry URL.

If the trainer's process dies (a node lost, memory exhausted), the run is marked failed with the
cause, and `reprorl run --resume RUN` continues it from its newest checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path
from typing import Any

import torch

from reprorl.config import RunSpec, validate_spec
from reprorl.orchestrate.pipeline.ray_workers import connect_ray
from reprorl.sinks import SinkObserver, SinkTarget
from reprorl.store import RunRecord, Store

# How often this process reads the run's records while the actor trains.
POLL_S = 1.0


class TrainerActor:
    """Trains one run in its own process: the loop, the learner and, through it, the rollout workers."""

    def __init__(self, home: str, db_url: str | None, threads: int) -> None:
        # Ray sets a CPU actor's thread count from its CPU share; the learner uses the driver's.
        torch.set_num_threads(threads)
        self.store = Store(Path(home), db_url)

    def place(self) -> dict[str, Any]:
        import ray

        context = ray.get_runtime_context()
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "node_id": context.get_node_id(),
            "gpus": [str(g) for g in ray.get_gpu_ids()],
            "threads": torch.get_num_threads(),
        }

    async def train(
        self, spec: dict[str, Any], run_id: str, resume: bool, address: str, sinks: list[SinkTarget]
    ) -> list[tuple[str, str]]:
        """Train the run; returns (sink, reason) for each metric sink that had to be disabled."""
        from reprorl.orchestrate.jobs.train import train_run

        record = RunRecord(self.store, run_id)
        run = validate_spec(spec)
        # Sinks mirror lines as they are written, so they follow the run where it is written: here.
        observer = SinkObserver(sinks, run_id=run_id) if sinks else None
        with RunRecord.observing(observer) if observer else contextlib.nullcontext():
            try:
                if resume:
                    await train_run(self.store, run, resume=record, ray=address)
                else:
                    await train_run(self.store, run, created=record, ray=address)
            finally:
                failures = observer.close() if observer else []
        return failures


async def train_on_ray(
    store: Store,
    spec: RunSpec,
    record: RunRecord,
    *,
    address: str,
    resume: bool = False,
    gpus: float = 0.0,
    sinks: list[SinkTarget] | None = None,
    show_progress: bool = False,
) -> tuple[RunRecord, list[tuple[str, str]]]:
    """Train `record` (a fresh run of `spec`, or one to resume) in a trainer actor on `address`;
    returns it and the metric sinks that had to be disabled, with why."""
    from reprorl.orchestrate.run.rollouts import progress_bar

    ray = connect_ray(address, spec.learning.pipeline.workers)
    # The controller mostly waits on the workers and its learner threads; it takes no CPU slot, so
    # a cluster whose CPUs the rollout workers fill still places it.
    actor_class = ray.remote(num_cpus=0, num_gpus=gpus, max_restarts=0)(TrainerActor)
    actor = actor_class.options(name=f"trainer-{record.run_id}").remote(
        str(store.root), store._db_url, torch.get_num_threads()
    )
    place = await actor.place.remote()
    record.event("trainer_actor", backend="ray", address=address, **place)
    training = actor.train.remote(spec.model_dump(mode="json"), record.run_id, resume, address, sinks or [])
    steps = spec.learning.steps
    try:
        with progress_bar("training (Ray trainer actor)", show_progress) as progress:
            bar = progress.add_task("steps", total=steps)
            while True:
                done, _ = ray.wait([training], timeout=0)
                progress.update(bar, completed=_steps_done(record))
                if done:
                    break
                await asyncio.sleep(POLL_S)
        failures: list[tuple[str, str]] = await training
    except ray.exceptions.RayActorError as exc:
        record.set_status("failed", error=f"trainer actor died: {type(exc).__name__}: {exc}"[:500])
        raise
    except ray.exceptions.RayTaskError as exc:
        # The run's own error (recorded by the actor already), not Ray's wrapper around it.
        cause = exc.cause
        raise cause if isinstance(cause, BaseException) else exc from None
    finally:
        ray.kill(actor)
    return record, failures


def _steps_done(record: RunRecord) -> int:
    """Updates the run's metric lines show so far."""
    try:
        lines = record.metrics().records
    except (OSError, ValueError):  # mid-write by the actor: the next poll reads it whole
        return 0
    return sum(1 for m in lines if m.get("stage") is None)
