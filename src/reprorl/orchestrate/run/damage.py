"""Damage a resume finds in a run's records, and the checkpoint it rewinds to so they are written again.

A rollout part whose bytes no longer match the sha256 in its name, or a metrics line that is torn
or no longer matches its checksum, cannot be kept: the run's record would no longer be what the run
did. A resume therefore rewinds to the newest intact checkpoint taken *before* the earliest damage
(with none, the run starts over under its own id) and runs again from there. On CPU the rerun writes
the same bytes the damaged records held, so nothing is lost and the run still ends bit-identical to
an unbroken one; on a backend that is not bit-reproducible the rerun's records are new samples, and
the events say so either way (`records_damaged`, then `rollouts_discarded` with reason `damaged`).

A damaged part is first renamed aside (`part-<sha>.parquet.damaged`, which no reader lists) after
its discard is logged, so a kill at any point leaves the damage visible to the next resume, which
then makes the same choice; the rewind removes the renamed files. A job whose steps do not depend
on one another (a screen's chunks) drops only the damaged steps' lines and runs those steps again
(`drop_damaged_steps`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from reprorl.orchestrate.run.checkpoint import Checkpoint, intact_checkpoints
from reprorl.store import RunRecord
from reprorl.store.atomic import write_atomic
from reprorl.store.rollouts import DISCARDED_EVENT, ROLLOUTS_DIR, STEP_RE, find_parts
from reprorl.store.runs import parse_log_line

DAMAGED_SUFFIX = ".damaged"
DAMAGED_EVENT = "records_damaged"
_HASH_CHUNK = 1 << 20


@dataclass(frozen=True)
class Damage:
    """What of a run's records no longer verifies."""

    parts: dict[str, int]  # part path (relative to the run folder, as it was named) -> its step
    metrics_line: int | None  # the first torn or altered line of metrics.jsonl (1-based)
    metrics_offset: int  # where that line starts; the file's length when no line is damaged
    metrics_size: int

    def __bool__(self) -> bool:
        return bool(self.parts) or self.metrics_line is not None

    def allows(self, checkpoint: Checkpoint, keep: frozenset[str]) -> bool:
        """Whether resuming from `checkpoint` (keeping the parts `keep`) writes every damaged record again."""
        state = checkpoint.state
        return state.metrics_bytes <= self.metrics_offset and all(
            step >= state.next_step and part not in keep for part, step in self.parts.items()
        )


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _set_aside(run_dir: Path) -> Iterator[tuple[str, int]]:
    """Parts an earlier resume found damaged and renamed aside, by their original name."""
    root = run_dir / ROLLOUTS_DIR
    for path in sorted(root.glob(f"step=*/part-*.parquet{DAMAGED_SUFFIX}")) if root.is_dir() else []:
        match = STEP_RE.fullmatch(path.parent.name)
        if match is not None:
            yield path.relative_to(run_dir).as_posix().removesuffix(DAMAGED_SUFFIX), int(match.group(1))


def _metrics_damage(path: Path) -> tuple[int | None, int, int]:
    """The first bad line of a run log (or None), where it starts, and the file's length."""
    offset = 0
    if not path.exists():
        return None, 0, 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.endswith(b"\n") or parse_log_line(raw) is None:
                size = path.stat().st_size
                return number, offset, size
            offset += len(raw)
    return None, offset, offset


def find_damage(record: RunRecord) -> Damage:
    """Every rollout part whose bytes do not match its name, and the first bad metrics line."""
    parts = dict(_set_aside(record.path))
    for path, step, digest in find_parts(record.path):
        if _sha256_of(path) != digest:
            parts[path.relative_to(record.path).as_posix()] = step
    line, offset, size = _metrics_damage(record.path / "metrics.jsonl")
    return Damage(parts, line, offset, size)


def set_aside(record: RunRecord, damage: Damage) -> None:
    """Log the damage and the damaged parts' discard, then rename those parts out of every reader's view."""
    found = {
        "parts": sorted(damage.parts),
        "metrics_line": damage.metrics_line,
    }
    record.event(DAMAGED_EVENT, **found)
    present = [p for p in sorted(damage.parts) if (record.path / p).exists()]
    if present:
        # Logged before the files move, so a kill in between still accounts for every part.
        record.event(DISCARDED_EVENT, parts=present, reason="damaged")
    for name in present:
        path = record.path / name
        path.rename(path.with_name(path.name + DAMAGED_SUFFIX))


def resume_point(
    record: RunRecord, keep_on_resume: Callable[[RunRecord, Checkpoint], frozenset[str]]
) -> tuple[Checkpoint | None, frozenset[str]]:
    """The checkpoint a resume rewinds to and the parts past it that it keeps.

    The newest intact checkpoint, unless records it depends on are damaged: then the newest one
    before every damaged record (None: start over). `keep_on_resume` is the loop source's; it is
    called for each checkpoint tried, and the last call is the one resumed from.
    """
    damage = find_damage(record)
    if damage:
        set_aside(record, damage)
    tried = False
    for checkpoint in intact_checkpoints(record):
        tried = True
        if checkpoint.state.metrics_bytes > damage.metrics_size:
            continue  # the metrics it counts on were cut short
        keep = keep_on_resume(record, checkpoint)
        if damage.allows(checkpoint, keep):
            if damage:
                step = checkpoint.state.next_step
                record.event("rewound_past_damage", checkpoint=checkpoint.path.name, step=step)
            return checkpoint, keep
    if damage or tried:
        record.event("rewound_past_damage", checkpoint=None, step=0)
    return None, frozenset()


def drop_damaged_steps(record: RunRecord) -> set[int]:
    """For a job of independent steps: set the damage aside, keep the intact metrics lines before
    the first bad one except those of steps with a damaged part, and return the steps whose lines
    were dropped (run them again). The job sweeps parts of steps without a line itself."""
    damage = find_damage(record)
    if not damage:
        return set()
    set_aside(record, damage)
    metrics = record.path / "metrics.jsonl"
    again = set(damage.parts.values())
    data = metrics.read_bytes() if metrics.exists() else b""
    kept, dropped = [], set(again)
    for at, raw in enumerate(data.splitlines(keepends=True)):
        line = parse_log_line(raw)
        if line is not None and line.get("step") not in again and at + 1 < (damage.metrics_line or at + 2):
            kept.append(raw)
        elif line is not None:
            dropped.add(int(line["step"]))
    write_atomic(metrics, b"".join(kept))
    record.event("rewound_past_damage", steps=sorted(dropped), metrics_lines_kept=len(kept))
    for aside in (record.path / ROLLOUTS_DIR).glob(f"step=*/part-*.parquet{DAMAGED_SUFFIX}"):
        aside.unlink(missing_ok=True)
    return dropped
