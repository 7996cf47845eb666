"""What a source of batches gives the training loop, and the parts both sources share.

A source decides which groups each step trains on and samples them ahead of the trainer, through
the executor, from the policy versions the staleness bound allows (`planned.py`: each step's own
groups; `arrival_source.py`: groups in the order they finish). The loop asks it only for what is
in this protocol: the batch of a step, what a checkpoint must hold of what it has sampled, and
what a resume keeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow.parquet as pq
import torch
from safetensors.torch import load_file, save_file

from reprorl.errors import RecordError
from reprorl.orchestrate.pipeline.executors import BatchRunner
from reprorl.orchestrate.pipeline.versions import PolicyVersion, PolicyVersions
from reprorl.orchestrate.run.checkpoint import Checkpoint
from reprorl.rollout.runner import RolloutResult
from reprorl.store import RunRecord
from reprorl.store.rollouts import PartFile, RolloutWriter, verify_part
from reprorl.types import Trajectory

PIPELINE_FILE = "pipeline.json"
VERSIONS_DIR = "versions"


@dataclass(frozen=True)
class Batch:
    """One step's sampled groups, the policy version that sampled them, and where they are stored."""

    step: int
    version: int  # the policy version (updates taken) its tokens were sampled from (the oldest)
    policy_version: str  # that version's hash, as its rollouts record it
    result: RolloutResult
    part: str | None  # its rollout part, relative to the run folder
    sha256: str | None
    wall_s: float = 0.0  # from the batch's start to its last episode's end
    restored: bool = False  # read back from a checkpoint's buffer rather than sampled by this process
    versions: tuple[int, ...] = field(default=())  # each group's version, where they differ


class Source(Protocol):
    """Where the loop's batches come from (see the module docstring)."""

    name: str  # as `learning.pipeline.source` names it

    def keep_on_resume(self, record: RunRecord, checkpoint: Checkpoint) -> frozenset[str]:
        """Rollout parts past `checkpoint` that a resume keeps (it reads them back instead).

        A resume may ask for several checkpoints, newest first (run/damage.py); the last one
        asked is the one it resumes from.
        """
        ...

    async def restore(self, start: int) -> None:
        """Put back what the checkpoint held, before the producer starts at step `start`."""
        ...

    def produce(self, batches: BatchRunner, start: int) -> Coroutine[Any, Any, None]:
        """The producer: sample what steps `start` onwards train on, as far ahead as the bound allows."""
        ...

    async def open_version(self, step: int) -> None:
        """Version `step` is published and its eval point (if any) behind it: it may be sampled."""
        ...

    async def take(self, step: int) -> Batch:
        """Step `step`'s batch, once it may be trained on."""
        ...

    def write_state(self, folder: Path, next_step: int) -> None:
        """What a checkpoint before `next_step` holds of the sampled, untrained work."""
        ...

    @property
    def depth(self) -> int:
        """Sampled work waiting for the trainer."""
        ...

    @property
    def max_staleness(self) -> int:
        """Versions a sample may lag behind the weights it trains."""
        ...


class VersionUser:
    """What a producer does with policy versions: ship each to the batch runner once, hold one
    while a batch samples from it, and retire those nothing will sample from again."""

    def __init__(self, batches: BatchRunner, versions: PolicyVersions) -> None:
        self.batches, self.versions = batches, versions
        self._shipped: set[int] = set()  # versions the batch runner has received
        self._newest = -1  # the version the latest started batch samples from

    async def hold(self, index: int) -> PolicyVersion:
        """Version `index`, once published and open, held for one batch."""
        version = await self.versions.wait(index)
        if index not in self._shipped:
            await self.batches.publish(version)
            self._shipped.add(index)
        version.users += 1
        self._newest = max(self._newest, index)
        self.versions.retire_below(self._newest)
        await self.batches.retire_below(self._newest)
        return version

    def release(self, version: PolicyVersion) -> None:
        version.users -= 1
        self.versions.retire_below(self._newest)


Fail = Callable[[BaseException], Awaitable[None]]


def stored(writer: RolloutWriter, part: PartFile | None) -> tuple[str | None, str | None]:
    """A written part as a queue entry names it: its path in the run folder, its sha256."""
    if part is None:
        return None, None
    return part.path.relative_to(writer.run_dir).as_posix(), part.sha256


async def gather_or_fail(tasks: set[asyncio.Task[None]], fail: Fail) -> None:
    """Wait for a producer's tasks; on an error cancel the rest and pass the error on (`fail`)."""
    try:
        await asyncio.gather(*tasks)
    except BaseException as exc:
        await cancel_all(tasks, exc, fail)
        raise


async def cancel_all(tasks: set[asyncio.Task[None]], exc: BaseException, fail: Fail) -> None:
    """Cancel a producer's tasks after `exc`, and tell the trainer unless it was a cancellation."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if not isinstance(exc, asyncio.CancelledError):
        await fail(exc)


def read_result(record: RunRecord, part: str, step: int, sha256: str, policy_version: str) -> RolloutResult:
    """A stored part as the trainer takes it: its rollouts that count, then the retried attempts;
    checked against its hash and against the version that should have sampled it."""
    path = record.path / part
    verify_part(path, step, sha256, record.run_id)
    table = pq.ParquetFile(path).read(columns=["record"])  # type: ignore[no-untyped-call]
    rows = table.column("record").to_pylist()
    trajectories = [Trajectory.model_validate_json(row) for row in rows]
    if any(t.policy_version != policy_version for t in trajectories if t.turns):
        raise RecordError(f"{part}: its rollouts were not sampled from {policy_version}")
    return RolloutResult(
        trajectories=[t for t in trajectories if not t.retried],
        retried=[t for t in trajectories if t.retried],
    )


def save_versions(folder: Path, versions: dict[int, tuple[str, dict[str, torch.Tensor]]]) -> dict[str, str]:
    """Each version's tensors into the checkpoint being staged; returns index -> hash for its record."""
    (folder / VERSIONS_DIR).mkdir(exist_ok=True)
    for index, (_, tensors) in sorted(versions.items()):
        target = folder / VERSIONS_DIR / f"{index}.safetensors"
        save_file({n: t.contiguous() for n, t in tensors.items()}, str(target))
    return {str(i): v for i, (v, _) in sorted(versions.items())}


def version_tensors(folder: Path, index: int) -> dict[str, torch.Tensor]:
    return load_file(str(folder / VERSIONS_DIR / f"{index}.safetensors"))
