"""Where a killed run resumes: the newest checkpoint whose every record it keeps is intact.

A resume keeps what the run wrote before its checkpoint (metric lines up to the checkpoint's length
of `metrics.jsonl`, rollout parts of the steps it took) and redoes the rest. A kill can only tear
what comes after the checkpoint, which the rewind cuts anyway; but a flipped byte on disk, a part
file someone truncated or a metrics line edited by hand can sit before it. Resuming past such a
record would end in a run whose record is missing what it trained on, so the resume goes back to
the newest checkpoint taken before the damage (or to the start, when none is), and the steps from
there are run again: on the CPU they write the same bytes, so the record ends whole and
bit-identical to an unbroken run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from reprorl.errors import RecordError, StoreError
from reprorl.orchestrate.run.checkpoint import (
    STEP_PREFIX,
    Checkpoint,
    checkpoints_root,
    verify_checkpoint,
)
from reprorl.store import RunRecord
from reprorl.store.rollouts import DISCARDED_EVENT, find_parts, verify_part
from reprorl.store.runs import parse_log_line

__all__ = ["Damage", "find_damage", "resume_checkpoint"]


@dataclass(frozen=True)
class Damage:
    """The records of a run that no longer read back as written."""

    parts: dict[str, str]  # part path (relative to the run) -> why it failed its check
    metrics_offset: int | None  # byte offset of the first metrics line that fails its checksum
    metrics_line: int | None  # its line number (1-based)

    def __bool__(self) -> bool:
        return bool(self.parts) or self.metrics_offset is not None


def find_damage(record: RunRecord, *, metrics_upto: int | None = None) -> Damage:
    """Check every rollout part against its name and every whole metrics line against its checksum.

    Only lines that start before `metrics_upto` are read: past it the rewind cuts the file anyway,
    and the last line a kill tore is expected there.
    """
    parts: dict[str, str] = {}
    for path, step, digest in find_parts(record.path):
        try:
            verify_part(path, step, digest, record.run_id)
        except StoreError as exc:  # corrupt bytes, or a file that is not the part its name says
            parts[path.relative_to(record.path).as_posix()] = str(exc)
    offset, line_no = _first_bad_line(record.path / "metrics.jsonl", metrics_upto)
    return Damage(parts, offset, line_no)


def _first_bad_line(path: Path, upto: int | None) -> tuple[int | None, int | None]:
    if not path.exists():
        return None, None
    offset = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if upto is not None and offset >= upto:
                break
            if parse_log_line(raw) is None:
                return offset, number
            offset += len(raw)
    return None, None


def resume_checkpoint(
    record: RunRecord, keep_of: Callable[[Checkpoint], frozenset[str]]
) -> tuple[Checkpoint | None, frozenset[str]]:
    """The newest intact checkpoint whose kept records are all intact, and the parts past it to keep.

    `keep_of(checkpoint)` names the parts sampled ahead of a checkpoint that its resumed loop trains
    on. Checkpoints passed over, and damaged records, are logged as events; damaged parts the chosen
    checkpoint does not keep are discarded like any part past it (the rerun writes them again).
    None means the run starts again from its first step.
    """
    root = checkpoints_root(record)
    candidates = sorted(root.glob(f"{STEP_PREFIX}*"), reverse=True) if root.is_dir() else []
    verified: list[Checkpoint] = []
    for path in candidates:
        try:
            verified.append(Checkpoint(path, verify_checkpoint(path)))
        except RecordError as exc:
            record.event("checkpoint_damaged", path=path.name, error=str(exc))
    newest_len = max((c.state.metrics_bytes for c in verified), default=0)
    damage = find_damage(record, metrics_upto=newest_len)
    if damage:
        record.event(
            "records_damaged",
            parts=sorted(damage.parts),
            reasons=[damage.parts[p] for p in sorted(damage.parts)],
            metrics_line=damage.metrics_line,
        )
    checkpoint: Checkpoint | None = None
    keep: frozenset[str] = frozenset()
    for candidate in verified:
        wanted = keep_of(candidate)
        reason = _unusable(candidate, wanted, damage)
        if reason is None:
            checkpoint, keep = candidate, wanted
            break
        record.event("checkpoint_passed_over", path=candidate.path.name, reason=reason)
    next_step = checkpoint.state.next_step if checkpoint else 0
    # What is damaged lies at or past the resume point (`_unusable` saw to that): it goes now,
    # logged with its reason, and the rerun writes it again.
    gone = [p for p in sorted(damage.parts) if p not in keep]
    if gone:
        record.event(DISCARDED_EVENT, parts=gone, reason="damaged", from_step=next_step)
        for name in gone:
            (record.path / name).unlink(missing_ok=True)
    return checkpoint, keep


def _step_of_part(relative: str) -> int:
    return int(relative.split("/")[1].removeprefix("step="))


def _unusable(checkpoint: Checkpoint, keep: frozenset[str], damage: Damage) -> str | None:
    """Why a resume cannot start from `checkpoint`, or None when everything it keeps is intact."""
    needed = [p for p in sorted(damage.parts) if p in keep or _step_of_part(p) < checkpoint.state.next_step]
    if needed:
        return f"it keeps the damaged rollout part {needed[0]}"
    if damage.metrics_offset is not None and damage.metrics_offset < checkpoint.state.metrics_bytes:
        return f"it keeps metrics.jsonl line {damage.metrics_line}, which fails its checksum"
    return None
