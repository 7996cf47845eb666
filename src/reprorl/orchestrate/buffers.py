"""The sample queue in a checkpoint: buffered batches and the policy versions still to be sampled from.

An asynchronous run's checkpoint at step n holds, besides the trainer, `pipeline.json` — each batch
sampled but not yet trained on (step, version, its rollout part and that part's sha256) — and the
trained tensors of every version that a batch from step n on will still be sampled from
(`versions/<index>.safetensors`). On resume, those batches are read back from their parts instead
of being sampled again, a batch that finished after the checkpoint from one of those versions is
kept as well (its part proves it was finished), and every other batch is sampled again from the
very weights it would have had. Nothing generated is silently skipped: what is kept and what is
dropped are both logged as events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import torch
from safetensors.torch import load_file, save_file

from reprorl.errors import RecordError
from reprorl.orchestrate.pipeline import Batch
from reprorl.rollout.runner import RolloutResult
from reprorl.store import RunRecord
from reprorl.store.rollouts import find_parts, verify_part
from reprorl.types import Split, Trajectory

PIPELINE_FILE = "pipeline.json"
VERSIONS_DIR = "versions"


@dataclass(frozen=True)
class BufferedBatch:
    """A batch a checkpoint names as sampled and stored but not yet trained on."""

    step: int
    version: int
    policy_version: str
    part: str
    sha256: str


@dataclass(frozen=True)
class PipelineState:
    """What an asynchronous checkpoint holds of its sample queue."""

    buffered: tuple[BufferedBatch, ...]
    versions: dict[int, str]  # version index -> hash, for versions still to be sampled from


def save_pipeline(
    folder: Path, buffered: list[Batch], versions: dict[int, tuple[str, dict[str, torch.Tensor]]]
) -> None:
    """Write the queue's batches and the versions' tensors into a checkpoint being staged."""
    entries = [
        BufferedBatch(b.step, b.version, b.policy_version, b.part, b.sha256).__dict__
        for b in buffered
        if b.part is not None and b.sha256 is not None
    ]
    state = {"buffered": entries, "versions": save_versions(folder, versions)}
    (folder / PIPELINE_FILE).write_text(json.dumps(state, sort_keys=True, indent=1) + "\n")


def save_versions(folder: Path, versions: dict[int, tuple[str, dict[str, torch.Tensor]]]) -> dict[str, str]:
    """Each version's tensors into the checkpoint being staged; returns index -> hash for its record."""
    (folder / VERSIONS_DIR).mkdir(exist_ok=True)
    for index, (_, tensors) in sorted(versions.items()):
        target = folder / VERSIONS_DIR / f"{index}.safetensors"
        save_file({n: t.contiguous() for n, t in tensors.items()}, str(target))
    return {str(i): v for i, (v, _) in sorted(versions.items())}


def load_pipeline(folder: Path) -> PipelineState | None:
    """The pipeline state of a checkpoint folder; None for a checkpoint without one (a sync run's)."""
    path = folder / PIPELINE_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return PipelineState(
        tuple(BufferedBatch(**entry) for entry in data["buffered"]),
        {int(i): v for i, v in data["versions"].items()},
    )


def version_tensors(folder: Path, index: int) -> dict[str, torch.Tensor]:
    return load_file(str(folder / VERSIONS_DIR / f"{index}.safetensors"))


def surviving_batches(
    record: RunRecord, state: PipelineState, next_step: int, version_for: dict[int, int]
) -> list[BufferedBatch]:
    """The train batches of steps from `next_step` on that a resume keeps, in step order.

    The checkpoint's buffered batches, plus any later train part of a step whose every rollout was
    sampled from the version that step samples from, when the checkpoint holds that version (the
    part was finished after the checkpoint; sampling it again would give the same bytes).
    `version_for` maps each step still to be trained to its version index.
    """
    kept = {b.step: b for b in state.buffered if b.step >= next_step}
    for path, step, digest in find_parts(record.path):
        if step < next_step or step in kept or step not in version_for:
            continue
        index = version_for[step]
        expected = state.versions.get(index)
        if expected is None:
            continue
        # One file, read as itself: a dataset read would also parse `step=…` in its folder's name.
        table = pq.ParquetFile(path).read(columns=["split", "policy_version"])  # type: ignore[no-untyped-call]
        splits = set(table.column("split").to_pylist())
        versions = set(table.column("policy_version").to_pylist())
        if splits == {Split.TRAIN.value} and versions - {""} == {expected}:
            part = path.relative_to(record.path).as_posix()
            kept[step] = BufferedBatch(step, index, expected, part, digest)
    return [kept[s] for s in sorted(kept)]


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


def read_batch(record: RunRecord, buffered: BufferedBatch) -> Batch:
    """A stored batch as the trainer takes it."""
    result = read_result(record, buffered.part, buffered.step, buffered.sha256, buffered.policy_version)
    return Batch(
        buffered.step,
        buffered.version,
        buffered.policy_version,
        result,
        buffered.part,
        buffered.sha256,
        restored=True,
    )
