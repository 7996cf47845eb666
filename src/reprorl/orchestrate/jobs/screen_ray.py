"""Screening on Ray: whole chunks of a screen dealt to worker actors, their verdicts recorded here.

Each `ScreenWorker` loads the policy once and screens one chunk at a time with the runner settings
a single process would use (a chunk is always screened whole, by one worker), writing the chunk's
rollout part itself; this process writes each chunk's verdict line as it arrives, so a resume
sees exactly the chunks that finished. A worker that dies costs the chunk it held, not the screen:
the chunk goes back in the queue for the workers still alive (a `screen_worker_lost` event names
it), and only when none is left does the screen fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from reprorl.config.screen import ScreenSpec
from reprorl.evaluation.screening import TaskScreen
from reprorl.orchestrate.pipeline.ray_workers import WORKER_START_S, connect_ray
from reprorl.store import RunRecord, Store

# A screener as a worker needs it, built in the actor's process by the function the driver passes
# (by reference: the actor imports the screening module itself, so this one never imports it).
BuildScreener = Callable[[Store, ScreenSpec, RunRecord], Any]


class Screener(Protocol):
    """What the driver side reads of the screener it farms chunks out for."""

    store: Store
    spec: ScreenSpec
    record: RunRecord


class ScreenWorker:
    """One Ray actor's screener and open runner; screens the chunks it is given."""

    def __init__(
        self,
        home: str,
        db_url: str | None,
        spec: dict[str, Any],
        run_id: str,
        threads: int,
        build: BuildScreener,
    ) -> None:
        torch.set_num_threads(threads)  # the driver's split of the work, so results match it
        store = Store(Path(home), db_url)
        self.screener = build(store, ScreenSpec.model_validate(spec), RunRecord(store, run_id))
        self._opened: Any = None
        self.runner: Any = None

    async def start(self) -> dict[str, Any]:
        self._opened = self.screener.runner()
        self.runner = await self._opened.__aenter__()
        return {"host": socket.gethostname(), "pid": os.getpid(), "threads": torch.get_num_threads()}

    async def chunk(self, index: int) -> list[dict[str, Any]]:
        screened = await self.screener.sample_chunk(self.runner, index)
        return [s.to_json() for s in screened]

    async def stop(self) -> None:
        if self._opened is not None:
            await self._opened.__aexit__(None, None, None)
            self._opened = None


async def screen_on_ray(
    screener: Screener, todo: Sequence[int], address: str, workers: int, build: BuildScreener
) -> AsyncIterator[tuple[int, list[TaskScreen]]]:
    """Yield (chunk, verdicts) as `workers` actors on the cluster at `address` finish chunks of `todo`."""
    ray = connect_ray(address, workers)
    record = screener.record
    actor_class = ray.remote(num_cpus=1, max_restarts=0)(ScreenWorker)
    names = [f"screen-{record.run_id}-{i}" for i in range(workers)]
    actors: dict[str, Any] = {
        name: actor_class.options(name=name).remote(
            str(screener.store.root),
            screener.store._db_url,
            screener.spec.model_dump(mode="json"),
            record.run_id,
            torch.get_num_threads(),
            build,
        )
        for name in names
    }
    try:
        started = await asyncio.wait_for(
            asyncio.gather(*(a.start.remote() for a in actors.values())), timeout=WORKER_START_S
        )
        record.event(
            "screen_workers",
            backend="ray",
            address=address,
            workers=[{"name": n, **i} for n, i in zip(names, started, strict=True)],
        )
        pending, idle = deque(todo), list(names)
        running: dict[asyncio.Future[Any], tuple[str, int]] = {}
        while pending or running:
            while pending and idle:
                name, index = idle.pop(0), pending.popleft()
                running[asyncio.ensure_future(_result(actors[name].chunk.remote(index)))] = (name, index)
            finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for future in finished:
                name, index = running.pop(future)
                try:
                    lines = future.result()
                except ray.exceptions.RayActorError as exc:
                    record.event("screen_worker_lost", worker=name, chunk=index, error=type(exc).__name__)
                    actors.pop(name)
                    pending.appendleft(index)
                    if not actors:
                        raise RuntimeError(f"every screen worker died; the last held chunk {index}") from exc
                    continue
                idle.append(name)
                yield index, [TaskScreen.from_json(line) for line in lines]
    finally:
        for actor in actors.values():
            # A worker already gone, or stuck, has nothing more to close.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(actor.stop.remote(), timeout=60)
            ray.kill(actor)


async def _result(ref: Any) -> Any:
    return await ref
