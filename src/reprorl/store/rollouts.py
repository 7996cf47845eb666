"""Rollout tables: trajectories stored as checksummed, schema-versioned Parquet parts under their run.

A batch of trajectories becomes one file, `runs/<run_id>/rollouts/step=<NNNNNN>/part-<sha256>.parquet`:
one row per trajectory, the queryable fields flattened into columns and the complete record kept as
JSON in `record`, from which `Trajectory.model_validate_json` restores the exact object. The file's
name is the sha256 of its bytes, so the checksum appears in the same rename that makes the file
visible; a killed writer leaves only a `.tmp-*` file that readers never open. The schema version is
both a column and Parquet key-value metadata, checked on every read together with the checksum.
Queries go through `reprorl.store.rollout_query.RolloutStore`. An ended run's parts can be merged into
a few large ones under `rollouts/steps=<first>-<last>/` (`reprorl.store.compaction`).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from reprorl.errors import IntegrityError, RecordError
from reprorl.store.atomic import write_atomic
from reprorl.store.runs import RunRecord
from reprorl.types import ToolOutcome, Trajectory

ROLLOUT_SCHEMA_VERSION = 1
FORMAT = "reprorl.rollouts"
ROLLOUTS_DIR = "rollouts"
WRITTEN_EVENT = "rollouts_written"
DISCARDED_EVENT = "rollouts_discarded"  # parts removed on purpose (a resume rewinds past them)
COMPACTED_EVENT = "rollouts_compacted"  # parts merged into one; it names the part and those it replaces
META_FORMAT, META_VERSION, META_RUN, META_STEP = (
    b"reprorl.format",
    b"reprorl.schema_version",
    b"reprorl.run_id",
    b"reprorl.step",
)
PART_RE = re.compile(r"part-([0-9a-f]{64})\.parquet")
STEP_RE = re.compile(r"step=(\d+)")
RANGE_RE = re.compile(r"steps=(\d+)-(\d+)")  # a compacted part's folder: the steps its rows span
_INT64_MAX = 2**63 - 1

TOOL_CALL = pa.struct(
    [
        ("turn", pa.int32()),
        ("tool", pa.string()),
        ("outcome", pa.string()),
        ("duration_s", pa.float64()),
        ("error", pa.string()),
    ]
)

SCHEMA = pa.schema(
    [
        ("schema_version", pa.int32()),
        ("run_id", pa.string()),
        ("step", pa.int64()),
        ("rollout_id", pa.string()),
        ("group_id", pa.string()),
        ("split", pa.string()),
        ("task_id", pa.string()),
        ("task_hash", pa.string()),
        ("prompt_template_hash", pa.string()),
        ("env_version", pa.string()),
        ("tool_versions", pa.map_(pa.string(), pa.string())),
        ("base_model_hash", pa.string()),
        ("adapter_version", pa.string()),
        ("policy_version", pa.string()),
        ("termination", pa.string()),
        ("error", pa.string()),
        ("infra_retries", pa.int32()),
        ("retried", pa.bool_()),
        ("member", pa.int32()),
        ("reward_total", pa.float64()),
        ("reward_components", pa.map_(pa.string(), pa.float64())),
        ("verifier_version", pa.string()),
        ("n_turns", pa.int32()),
        ("n_tool_calls", pa.int32()),
        ("n_tool_errors", pa.int32()),
        ("n_truncated_turns", pa.int32()),
        ("tool_outcomes", pa.list_(pa.string())),
        ("tool_calls", pa.list_(TOOL_CALL)),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("cost_usd", pa.float64()),
        ("wall_s", pa.float64()),
        ("cpu_s", pa.float64()),
        ("sample_s", pa.float64()),
        ("tool_s", pa.float64()),
        ("seed", pa.int64()),
        ("temperature", pa.float64()),
        ("top_p", pa.float64()),
        ("top_k", pa.int32()),
        ("max_tokens", pa.int32()),
        ("record", pa.string()),
    ]
)
COLUMNS = tuple(SCHEMA.names)
SUMMARY_COLUMNS = tuple(c for c in COLUMNS if c != "record")
# Dictionary encoding pays off for the repetitive columns only; every record is unique, and min/max
# statistics of whole records would only bloat the footer every query reads.
_DICTIONARY_COLUMNS = [c for c in COLUMNS if c not in ("record", "rollout_id", "tool_calls")]
_STATISTICS_COLUMNS = [c for c in COLUMNS if c != "record"]


def trajectory_row(trajectory: Trajectory, step: int) -> dict[str, Any]:
    """The flattened row of one trajectory; `record` holds the whole of it."""
    results = [(turn.index, r) for turn in trajectory.turns for r in turn.tool_results]
    reward = trajectory.reward
    sampling = trajectory.sampling
    return {
        "schema_version": ROLLOUT_SCHEMA_VERSION,
        "run_id": trajectory.run_id,
        "step": step,
        "rollout_id": trajectory.rollout_id,
        "group_id": trajectory.group_id,
        "split": trajectory.split.value,
        "task_id": trajectory.task_id,
        "task_hash": trajectory.task_hash,
        "prompt_template_hash": trajectory.prompt_template_hash,
        "env_version": trajectory.env_version,
        "tool_versions": sorted(trajectory.tool_versions.items()),
        "base_model_hash": trajectory.base_model_hash,
        "adapter_version": trajectory.adapter_version,
        "policy_version": trajectory.policy_version,
        "termination": trajectory.termination.value,
        "error": trajectory.error,
        "infra_retries": trajectory.infra_retries,
        "retried": trajectory.retried,
        "member": trajectory.member,
        "reward_total": None if reward is None else reward.total,
        "reward_components": None if reward is None else sorted(reward.components.items()),
        "verifier_version": None if reward is None else reward.verifier_version,
        "n_turns": len(trajectory.turns),
        "n_tool_calls": len(results),
        "n_tool_errors": sum(r.outcome is not ToolOutcome.OK for _, r in results),
        "n_truncated_turns": sum(t.finish_reason == "length" for t in trajectory.turns),
        "tool_outcomes": [r.outcome.value for _, r in results],
        "tool_calls": [
            {
                "turn": i,
                "tool": r.name,
                "outcome": r.outcome.value,
                "duration_s": r.duration_s,
                "error": r.error,
            }
            for i, r in results
        ],
        "prompt_tokens": trajectory.prompt_tokens,
        "completion_tokens": trajectory.completion_tokens,
        "cost_usd": trajectory.cost_usd,
        "wall_s": trajectory.wall_s,
        "cpu_s": trajectory.cpu_s,
        "sample_s": sum(t.sample_s for t in trajectory.turns),
        "tool_s": sum(t.tool_s for t in trajectory.turns),
        # A seed outside int64 stays exact in `record`; the column cannot hold it.
        "seed": sampling.seed if -_INT64_MAX - 1 <= sampling.seed <= _INT64_MAX else None,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "max_tokens": sampling.max_tokens,
        "record": trajectory.model_dump_json(),
    }


def part_schema(run_id: str, label: str) -> pa.Schema:
    """The schema of a part, with the format, version, run and step label in its metadata."""
    metadata = {
        META_FORMAT: FORMAT.encode(),
        META_VERSION: str(ROLLOUT_SCHEMA_VERSION).encode(),
        META_RUN: run_id.encode(),
        META_STEP: label.encode(),
    }
    return SCHEMA.with_metadata(metadata)


# How every part is encoded, whether written from a batch or merged by compaction.
WRITE_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "use_dictionary": _DICTIONARY_COLUMNS,
    "write_statistics": _STATISTICS_COLUMNS,
}


def to_table(run_id: str, step: int, trajectories: Sequence[Trajectory]) -> pa.Table:
    """One Arrow table for a batch, with the format, version, run and step in its metadata."""
    rows = [trajectory_row(t, step) for t in trajectories]
    return pa.Table.from_pylist(rows, schema=part_schema(run_id, step_label(step)))


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **WRITE_OPTIONS)  # type: ignore[no-untyped-call]
    return bytes(sink.getvalue())


@dataclass(frozen=True)
class PartFile:
    """One verified Parquet part of a run's rollouts."""

    path: Path
    step: int  # the first step its rows belong to
    sha256: str
    rows: int
    size: int
    last_step: int | None = None  # a compacted part's last step; None for one step's part


def run_location(run: RunRecord | Path) -> tuple[Path, str, RunRecord | None]:
    """(run folder, run id, record); a bare folder's name is its run id, as under `runs/`."""
    if isinstance(run, RunRecord):
        return run.path.absolute(), run.run_id, run
    path = Path(run).absolute()
    return path, path.name, None


class RolloutWriter:
    """Appends batches of trajectories to a run, one atomically written part file per batch."""

    def __init__(self, run: RunRecord | Path) -> None:
        self.run_dir, self.run_id, self.record = run_location(run)
        self.root = self.run_dir / ROLLOUTS_DIR

    def write(self, step: int, trajectories: Sequence[Trajectory]) -> PartFile | None:
        """Store `trajectories` as one part of `step`; an empty batch writes nothing.

        Writing the same batch again produces the same bytes, hence the same file: a retried
        write after a crash does not duplicate rows.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise RecordError(f"step must be an integer >= 0, not {step!r}")
        if not trajectories:
            return None
        seen: set[str] = set()
        for trajectory in trajectories:
            if trajectory.run_id != self.run_id:
                raise RecordError(
                    f"rollout {trajectory.rollout_id} belongs to run {trajectory.run_id!r}, "
                    f"not to {self.run_id!r} whose folder it would be written to"
                )
            if trajectory.rollout_id in seen:
                raise RecordError(f"rollout id {trajectory.rollout_id!r} appears twice in one batch")
            seen.add(trajectory.rollout_id)
        data = parquet_bytes(to_table(self.run_id, step, trajectories))
        digest = hashlib.sha256(data).hexdigest()
        target = self.root / f"step={step:06d}" / f"part-{digest}.parquet"
        write_atomic(target, data, mode=0o444)
        part = PartFile(target, step, digest, len(trajectories), len(data))
        if self.record is not None:
            self.record.event(
                WRITTEN_EVENT,
                step=step,
                part=target.relative_to(self.run_dir).as_posix(),
                sha256=digest,
                rows=part.rows,
                bytes=part.size,
            )
        return part

    def sweep_tmp(self, older_than_s: float = 3600.0) -> int:
        """Remove temp files that killed writers left behind; returns how many went."""
        cutoff = time.time() - older_than_s
        removed = 0
        for path in self.root.glob("step=*/.tmp-*"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime <= cutoff:
                    path.unlink()
                    removed += 1
        return removed


def find_parts(run_dir: Path) -> list[tuple[Path, int, str]]:
    """Every visible part file of a run as (path, step, sha256 in its name), in step order."""
    return [(path, int(folder[1]), digest) for path, folder, digest in _listed(run_dir, STEP_RE)]


def find_compacted(run_dir: Path) -> list[tuple[Path, int, int, str]]:
    """Every visible compacted part of a run as (path, first step, last step, sha256 in its name)."""
    return [(path, int(span[1]), int(span[2]), digest) for path, span, digest in _listed(run_dir, RANGE_RE)]


def _listed(run_dir: Path, folder_re: re.Pattern[str]) -> list[tuple[Path, re.Match[str], str]]:
    """Part files in the folders under `rollouts/` whose name `folder_re` matches, in name order."""
    root = run_dir / ROLLOUTS_DIR
    found: list[tuple[Path, re.Match[str], str]] = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        folder_match = folder_re.fullmatch(folder.name)
        if folder_match is None or not folder.is_dir():
            continue
        for path in sorted(folder.glob("part-*.parquet")):
            name_match = PART_RE.fullmatch(path.name)
            if name_match is None:
                raise RecordError(f"{path} is not a rollout part name (part-<sha256>.parquet)")
            found.append((path, folder_match, name_match.group(1)))
    return found


def step_label(step: int, last_step: int | None = None) -> str:
    """The step a part's metadata names: `7`, or `0-312` for a compacted part."""
    return str(step) if last_step is None else f"{step}-{last_step}"


def verify_part(path: Path, step: int, digest: str, run_id: str, last_step: int | None = None) -> PartFile:
    """Re-hash a part file and check its metadata; raise naming the file if anything is off."""
    meta, size = _verified_metadata(path, digest)
    kv = meta.metadata or {}
    if kv.get(META_FORMAT) != FORMAT.encode():
        raise RecordError(f"rollout part {path} is not a reprorl rollout table (no {FORMAT} metadata)")
    check_schema_version(kv.get(META_VERSION, b"").decode(errors="replace"), path)
    if kv.get(META_RUN, b"").decode(errors="replace") != run_id:
        raise RecordError(f"rollout part {path} belongs to run {kv.get(META_RUN, b'').decode()!r}")
    label = step_label(step, last_step)
    if kv.get(META_STEP) != label.encode():
        raise RecordError(f"rollout part {path} holds step {kv.get(META_STEP, b'').decode()}, not {label}")
    return PartFile(path, step, digest, meta.num_rows, size, last_step)


def _verified_metadata(path: Path, digest: str) -> tuple[Any, int]:
    """(Parquet metadata, size) of a file whose sha256 is `digest`, from one open handle, streamed:
    a compacted part is hundreds of megabytes, never held whole."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise RecordError(f"cannot read rollout part {path}: {exc.strerror or exc}") from None
    with handle:
        try:
            actual = hashlib.file_digest(handle, "sha256").hexdigest()
        except OSError as exc:
            raise RecordError(f"cannot read rollout part {path}: {exc.strerror or exc}") from None
        if actual != digest:
            raise IntegrityError(
                f"rollout part {path} is corrupt: its sha256 is {actual[:16]}…, its name says {digest[:16]}…",
                artifact=str(path),
                expected=digest,
                actual=actual,
            )
        size = handle.tell()
        handle.seek(0)
        try:
            meta = pq.read_metadata(handle)  # type: ignore[no-untyped-call]
        except (pa.ArrowException, OSError) as exc:
            raise RecordError(f"rollout part {path} is not a readable Parquet file: {exc}") from None
    return meta, size


def check_schema_version(text: str, path: Path) -> None:
    """Accept the version this code writes; refuse others with what to do about them."""
    try:
        version = int(text)
    except ValueError:
        raise RecordError(f"rollout part {path} has no valid schema version ({text!r})") from None
    if version > ROLLOUT_SCHEMA_VERSION:
        raise RecordError(
            f"rollout part {path} uses rollout schema v{version}, newer than v{ROLLOUT_SCHEMA_VERSION} "
            "that this reprorl reads; upgrade reprorl to read it"
        )
    if version != ROLLOUT_SCHEMA_VERSION:
        raise RecordError(
            f"rollout part {path} uses rollout schema v{version}, and this reprorl knows no upgrade "
            f"from it to v{ROLLOUT_SCHEMA_VERSION}"
        )
