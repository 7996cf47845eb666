"""Ray actors as rollout workers: each loads the base once and samples its share of every batch.

`RayExecutor` starts `learning.pipeline.workers` `RolloutWorker` actors on the cluster at an address
("local": one this run starts, and whose processes die with it). A version reaches a worker as its
trained tensors (a LoRA adapter's are small; the base never moves), and a batch's groups are dealt
to the live workers in turn and put back in job order. A worker that dies mid-batch costs its share
of the batch, not the run: each of its episodes is recorded as an infra failure (`retried`, with
the worker named in its error) and run again on the workers still alive; only when none is left
does the step fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from reprorl.config import RunSpec, validate_spec
from reprorl.errors import UserInputError
from reprorl.orchestrate.pipeline.executors import BatchRunner, deal
from reprorl.orchestrate.pipeline.ray_reaper import start_reaper
from reprorl.orchestrate.pipeline.versions import PolicyVersion, PolicyVersions
from reprorl.orchestrate.run.policies import OpenedPolicy, kept_bytes, load_run_base, torch_dtype
from reprorl.orchestrate.run.rollouts import runner_for
from reprorl.orchestrate.run.setup import build_trainer
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import Sampler
from reprorl.policy.vllm_engine import EngineSampler, ServedVersion
from reprorl.rollout.episode import Provenance
from reprorl.rollout.runner import RolloutJob, RolloutResult, RolloutRunner
from reprorl.store import RunRecord, Store
from reprorl.types import Trajectory

# Loading the base model and building the sampling copies, on a busy machine.
WORKER_START_S = 600.0


class RolloutWorker:
    """One worker's model, versions and runner; a Ray actor runs one of these in its own process."""

    def __init__(
        self,
        home: str,
        db_url: str | None,
        spec: dict[str, Any],
        run_id: str,
        threads: int | None = None,
        families: Sequence[str] = (),
    ) -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        self.home, self.db_url, self.spec_data, self.run_id = home, db_url, spec, run_id
        self.families = tuple(families)  # the driver's: the env families of the run's tasks
        self.versions: PolicyVersions | None = None
        self.runner: RolloutRunner | None = None
        # With a rollout engine (vLLM): each version's sampler, asking the trainer's servers.
        self.engine_samplers: dict[int, tuple[EngineSampler, Provenance]] = {}

    async def start(self) -> dict[str, Any]:
        spec = validate_spec(self.spec_data)
        store = Store(Path(self.home), self.db_url)
        loaded = load_run_base(store, spec)
        self.spec, self.loaded = spec, loaded
        self.renderer = ChatRenderer(loaded.tokenizer)
        if spec.model.vllm is None:  # samples here: the trained tensors' module layout, no optimizer
            trainer = build_trainer(store, loaded, spec)
            dtype = torch_dtype(spec.model.sampling_dtype)
            self.versions = PolicyVersions(
                trainer, loaded, dtype, self.renderer.template_hash, keep_bytes=kept_bytes(spec)
            )
        return {"host": socket.gethostname(), "pid": os.getpid(), "threads": torch.get_num_threads()}

    async def publish(self, index: int, tensors: dict[str, torch.Tensor]) -> str:
        assert self.versions is not None, "start() first"
        version = self.versions.publish(index, tensors)
        await self._open_runner(version.sampler, version.provenance)
        return version.version

    async def publish_served(self, index: int, served: ServedVersion) -> str:
        """Version `index` as the trainer's vLLM servers serve it: requests go to them, by name."""
        assert self.spec.model.vllm is not None
        sampler = served.sampler(self.spec.model.vllm)
        provenance = Provenance(self.loaded.base_hash, None, self.renderer.template_hash, sampler.info())
        self.engine_samplers[index] = (sampler, provenance)
        await self._open_runner(sampler, provenance)
        return served.version

    async def _open_runner(self, sampler: Sampler, provenance: Provenance) -> None:
        if self.runner is None:
            opened = OpenedPolicy(self.loaded, sampler, self.renderer, provenance)
            runner = runner_for(opened, self.spec, self.run_id, Path(self.home), families=self.families)
            self.runner = await runner.__aenter__()

    async def run(self, index: int, jobs: list[RolloutJob]) -> RolloutResult:
        assert self.runner is not None, "publish a version first"
        if index in self.engine_samplers:
            sampler, provenance = self.engine_samplers[index]
            return await self.runner.with_sampler(sampler, provenance).run(jobs)
        assert self.versions is not None
        version = self.versions.live[index]
        version.users += 1  # a version being sampled from is never retired under the batch
        try:
            return await self.runner.with_sampler(version.sampler, version.provenance).run(jobs)
        finally:
            version.users -= 1

    async def retire_below(self, index: int) -> None:
        if self.versions is not None:
            self.versions.retire_below(index)
        for old in [i for i in self.engine_samplers if i < index]:
            self.engine_samplers.pop(old)[0].close()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.__aexit__(None, None, None)
            self.runner = None


class RayBatches:
    """Ray actors as rollout workers; a dead one's episodes are recorded and run elsewhere."""

    def __init__(self, runner: RolloutRunner, actors: list[Any], names: list[str]) -> None:
        self.runner = runner  # the driver's: records the lost episodes the way its runner would
        self.actors = dict(zip(names, actors, strict=True))
        self.published: dict[int, Any] = {}  # version index -> its tensors in the object store
        self.lost: list[str] = []

    async def publish(self, version: PolicyVersion) -> None:
        import ray

        if isinstance(version.sampler, EngineSampler):  # the workers ask the servers: no tensors move
            served = ServedVersion.of(version.sampler)
            await self._each(lambda actor: actor.publish_served.remote(version.index, served))
            return
        ref = ray.put(version.tensors)
        self.published[version.index] = ref
        await self._each(lambda actor: actor.publish.remote(version.index, ref))

    async def retire_below(self, index: int) -> None:
        for old in [i for i in self.published if i < index]:
            del self.published[old]
        await self._each(lambda actor: actor.retire_below.remote(index))

    async def _each(self, call: Any) -> None:
        import ray

        for name, actor in list(self.actors.items()):
            try:
                await call(actor)
            except ray.exceptions.RayActorError as exc:
                self._drop(name, exc)

    def _drop(self, name: str, exc: BaseException) -> None:
        if name in self.actors:
            del self.actors[name]
            self.lost.append(f"{name}: {type(exc).__name__}")

    async def run(
        self, version: PolicyVersion, jobs: Sequence[RolloutJob], *, first_group: int = 0
    ) -> RolloutResult:
        import ray

        finals: list[Trajectory | None] = [None] * len(jobs)
        retried: list[Trajectory] = []
        pending = list(range(len(jobs)))
        while pending:
            if not self.actors:
                raise RuntimeError(f"every rollout worker died ({'; '.join(self.lost)})")
            alive = list(self.actors)
            dealt = zip(alive, deal([jobs[i] for i in pending], len(alive), first_group), strict=True)
            busy = [(name, share) for name, share in dealt if share]
            names, shares = [name for name, _ in busy], [share for _, share in busy]
            calls = [
                self.actors[name].run.remote(version.index, [jobs[pending[j]] for j in share])
                for name, share in busy
            ]
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            failed: list[int] = []
            for name, share, outcome in zip(names, shares, outcomes, strict=True):
                indices = [pending[j] for j in share]
                if isinstance(outcome, ray.exceptions.RayActorError):
                    self._drop(name, outcome)
                    for i in indices:
                        attempt = sum(t.rollout_id.startswith(f"{jobs[i].rollout_id}~") for t in retried) + 1
                        retried.append(
                            self.runner.lost(
                                jobs[i],
                                f"{jobs[i].rollout_id}~w{attempt}",
                                f"rollout worker {name} died mid-batch: {type(outcome).__name__}",
                            )
                        )
                    failed.extend(indices)
                elif isinstance(outcome, BaseException):
                    raise outcome
                else:
                    assert isinstance(outcome, RolloutResult)
                    for i, trajectory in zip(indices, outcome.trajectories, strict=True):
                        finals[i] = trajectory
                    retried.extend(outcome.retried)
            pending = sorted(failed)
        lost = Counter(t.rollout_id.split("~", 1)[0] for t in retried if t.error and "died" in t.error)
        return RolloutResult(
            trajectories=[
                t.model_copy(update={"infra_retries": t.infra_retries + lost[t.rollout_id]})
                if lost[t.rollout_id]
                else t
                for t in finals
                if t is not None
            ],
            retried=retried,
        )

    async def stop(self) -> None:
        """Close every worker's runner and end its actor (its CPUs go back to the cluster)."""
        import ray

        for actor in self.actors.values():
            # A worker already gone, or stuck, has nothing more to close.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(actor.stop.remote(), timeout=60)
            ray.kill(actor)


def connect_ray(address: str, workers: int) -> Any:
    """The `ray` module, connected to the cluster at `address` ("local": start one here) unless this
    process already is (a Ray actor, or a caller that connected first)."""
    try:
        import ray
    except ImportError:
        raise UserInputError("--ray needs Ray: pip install 'reprorl[ray]'", field="--ray") from None
    if not ray.is_initialized():
        if address == "local":
            ray.init(
                num_cpus=max(os.cpu_count() or 1, workers),
                include_dashboard=False,
                log_to_driver=False,
                namespace="reprorl",
            )
            start_reaper()  # the cluster is this run's: its processes die with it
        else:
            ray.init(address=address, namespace="reprorl", log_to_driver=False)
    return ray


async def start_ray_workers(
    address: str, store: Store, spec: RunSpec, run_id: str, runner: RolloutRunner
) -> tuple[RayBatches, dict[str, Any]]:
    """`learning.pipeline.workers` Ray actors on the cluster at `address` ("local": start one here).

    Every worker reads the same store (a shared folder, and the same registry URL, on a real
    cluster) and samples with the threads the driver uses, so the shares are computed alike.
    """
    count = spec.learning.pipeline.workers
    ray = connect_ray(address, count)
    actor = ray.remote(num_cpus=1, max_restarts=0)(RolloutWorker)
    names = [f"rollout-{run_id}-{i}" for i in range(count)]
    actors: list[Any] = [
        actor.options(name=name).remote(
            str(store.root),
            store._db_url,
            spec.model_dump(mode="json"),
            run_id,
            torch.get_num_threads(),
            sorted(runner.families),
        )
        for name in names
    ]
    started = await asyncio.wait_for(
        asyncio.gather(*(a.start.remote() for a in actors)), timeout=WORKER_START_S
    )
    info = {
        "backend": "ray",
        "address": address,
        "cluster": ray.get_runtime_context().gcs_address,
        "workers": [{"name": n, **i} for n, i in zip(names, started, strict=True)],
    }
    return RayBatches(runner, actors, names), info


class RayExecutor:
    """Batches run on Ray actors at `address` ("local": start a cluster here)."""

    name = "ray"

    def __init__(self, address: str) -> None:
        self.address = address
        self._batches: RayBatches | None = None
        self._workers = 0

    async def open(
        self, runner: RolloutRunner, store: Store, spec: RunSpec, record: RunRecord
    ) -> BatchRunner:
        self._batches, info = await start_ray_workers(self.address, store, spec, record.run_id, runner)
        self._workers = len(info["workers"])
        record.event("rollout_workers", **info)
        return self._batches

    async def close(self, record: RunRecord) -> None:
        if self._batches is not None:
            await self._batches.stop()
            if self._batches.lost:
                record.event("rollout_workers_lost", workers=self._batches.lost)

    @property
    def workers(self) -> int:
        return self._workers
