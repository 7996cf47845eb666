"""Checkpoints of a run: the trainer's state and the loop's cursor, written so a killed run resumes exactly.

A checkpoint is a folder `checkpoints/step-NNNNNN/` holding the trainer state (weights, optimizer
moments, RNG), the proximal-policy weights when the loss keeps them, and `loop.json`: the next step
to run, the adapter version, and how long `metrics.jsonl` was when it was taken. It is staged in a
temp folder, every file's sha256 is recorded, and it is renamed into place in one step, so a kill at
any instant leaves either the previous checkpoint or this one, never half of one.

Resuming rewinds the run to its newest intact checkpoint: metric lines and rollout parts written
after it are discarded (the discard is logged), then the loop runs again from its cursor. On CPU the
rerun writes the same bytes, so the resumed run ends bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reprorl.errors import RecordError
from reprorl.hashing import sha256_hex
from reprorl.store import RunRecord
from reprorl.store.atomic import fsync_dir, write_atomic
from reprorl.store.rollouts import DISCARDED_EVENT, ROLLOUTS_DIR, find_parts

CHECKPOINTS_DIR = "checkpoints"
STEP_PREFIX = "step-"
# The weights at an eval point every rollback rule passed: what a `revert` goes back to.
GOOD_PREFIX = "good-step-"
LOOP_FILE = "loop.json"
SUMS_FILE = "checksums.json"


@dataclass(frozen=True)
class LoopState:
    """Where the loop stands after a step: enough to continue it exactly."""

    next_step: int  # the first RL step not yet taken (0 right after the warm start)
    metrics_bytes: int  # length of metrics.jsonl when the checkpoint was taken
    policy_version: str = ""
    counters: dict[str, float] = field(default_factory=dict)  # running totals the loop keeps


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    state: LoopState


def checkpoints_root(record: RunRecord) -> Path:
    return record.path / CHECKPOINTS_DIR


def save_checkpoint(
    record: RunRecord,
    state: LoopState,
    write_state: Any,
    *,
    keep: int | None = 2,
    prefix: str = STEP_PREFIX,
) -> Checkpoint:
    """Stage `write_state(folder)` plus the loop state, seal it with checksums, and rename it in.

    The newest `keep` checkpoints of the same `prefix` are kept (all of them with None).
    """
    root = checkpoints_root(record)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{prefix}{state.next_step:06d}"
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        write_state(staging)
        write_atomic(staging / LOOP_FILE, (json.dumps(asdict(state), sort_keys=True) + "\n").encode())
        sums = {
            p.relative_to(staging).as_posix(): sha256_hex(p.read_bytes())
            for p in sorted(staging.rglob("*"))
            if p.is_file()
        }
        write_atomic(staging / SUMS_FILE, (json.dumps(sums, sort_keys=True, indent=1) + "\n").encode())
        fsync_dir(staging)
        if final.exists():  # the same step again after a resume: the new one replaces it
            shutil.rmtree(final)
        staging.rename(final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    record.event("checkpoint", step=state.next_step, path=final.relative_to(record.path).as_posix())
    for old in sorted(root.glob(f"{prefix}*"))[:-keep] if keep is not None else []:
        shutil.rmtree(old, ignore_errors=True)
    prune_good(record)
    return Checkpoint(final, state)


def _step_of(path: Path) -> int:
    return int(path.name.rsplit("-", 1)[1])


def prune_good(record: RunRecord) -> None:
    """Drop good-weights checkpoints no resume or revert can need.

    A resume rewinds to the newest step checkpoint and replays from there, so it may need the newest
    good one at or before it and every later one; older ones are superseded.
    """
    root = checkpoints_root(record)
    steps = [_step_of(p) for p in root.glob(f"{STEP_PREFIX}*")]
    newest = max(steps, default=-1)
    good = sorted(root.glob(f"{GOOD_PREFIX}*"), key=_step_of)
    settled = [p for p in good if _step_of(p) <= newest]
    for old in settled[:-1]:
        shutil.rmtree(old, ignore_errors=True)


def good_checkpoint(record: RunRecord, step: int) -> Checkpoint | None:
    """The newest intact good-weights checkpoint taken at or before `step`."""
    root = checkpoints_root(record)
    for path in sorted(root.glob(f"{GOOD_PREFIX}*"), key=_step_of, reverse=True):
        if _step_of(path) <= step:
            try:
                return Checkpoint(path, verify_checkpoint(path))
            except RecordError as exc:
                record.event("checkpoint_damaged", path=path.name, error=str(exc))
    return None


def verify_checkpoint(path: Path) -> LoopState:
    """The loop state of an intact checkpoint; raise naming the first file that does not match."""
    try:
        sums = json.loads((path / SUMS_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise RecordError(f"checkpoint {path.name}: {SUMS_FILE} is unreadable ({exc})") from None
    for name, expected in sums.items():
        try:
            actual = sha256_hex((path / name).read_bytes())
        except OSError:
            raise RecordError(f"checkpoint {path.name}: {name} is missing") from None
        if actual != expected:
            raise RecordError(f"checkpoint {path.name}: {name} does not match its checksum")
    return LoopState(**json.loads((path / LOOP_FILE).read_text()))


def intact_checkpoints(record: RunRecord) -> Iterator[Checkpoint]:
    """The step checkpoints that verify, newest first; a damaged one is logged and passed over."""
    root = checkpoints_root(record)
    for path in sorted(root.glob(f"{STEP_PREFIX}*"), reverse=True) if root.is_dir() else []:
        try:
            state = verify_checkpoint(path)
        except RecordError as exc:
            record.event("checkpoint_damaged", path=path.name, error=str(exc))
            continue
        yield Checkpoint(path, state)


def latest_checkpoint(record: RunRecord) -> Checkpoint | None:
    """The newest checkpoint that verifies."""
    return next(intact_checkpoints(record), None)


def rewind(record: RunRecord, checkpoint: Checkpoint | None, *, keep: frozenset[str] = frozenset()) -> int:
    """Discard what the run wrote after `checkpoint` (all of it, with none); returns the next step.

    Metric lines past the checkpoint are cut (the file is rewritten atomically), rollout parts of
    steps not yet checkpointed are removed and a discard event names them (except the parts in
    `keep`: batches sampled ahead that the resumed run trains on), and half-staged checkpoints are
    swept.
    """
    next_step = checkpoint.state.next_step if checkpoint else 0
    metrics_bytes = checkpoint.state.metrics_bytes if checkpoint else 0
    metrics = record.path / "metrics.jsonl"
    data = metrics.read_bytes() if metrics.exists() else b""
    if len(data) < metrics_bytes:
        raise RecordError(
            f"run {record.run_id}: metrics.jsonl is shorter than at its checkpoint (step {next_step})"
        )
    if len(data) > metrics_bytes:
        write_atomic(metrics, data[:metrics_bytes])
    discarded = [
        path.relative_to(record.path).as_posix()
        for path, step, _ in find_parts(record.path)
        if step >= next_step and path.relative_to(record.path).as_posix() not in keep
    ]
    if discarded:
        # Logged before the files go, so a kill in between still accounts for every part.
        record.event(DISCARDED_EVENT, parts=discarded, reason="resume", from_step=next_step)
        for name in discarded:
            (record.path / name).unlink(missing_ok=True)
    # Parts a resume found damaged and set aside: their discard is logged already (run/damage.py).
    for aside in (record.path / ROLLOUTS_DIR).glob("step=*/part-*.parquet.damaged"):
        aside.unlink(missing_ok=True)
    for step_dir in (record.path / ROLLOUTS_DIR).glob("step=*"):
        if step_dir.is_dir() and not any(step_dir.iterdir()):
            step_dir.rmdir()
    root = checkpoints_root(record)
    for stale in root.glob(".tmp-*") if root.is_dir() else []:
        shutil.rmtree(stale, ignore_errors=True)
    for later in [*root.glob(f"{STEP_PREFIX}*"), *root.glob(f"{GOOD_PREFIX}*")] if root.is_dir() else []:
        if checkpoint is None or _step_of(later) > next_step:
            shutil.rmtree(later, ignore_errors=True)
    return next_step
