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

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from reprorl.errors import RecordError
from reprorl.hashing import HASH_PREFIX
from reprorl.orchestrate.run.checkpoint import (
    LOOP_FILE,
    STEP_PREFIX,
    Checkpoint,
    checkpoints_root,
    verify_checkpoint,
)
from reprorl.policy.digest import file_hash
from reprorl.store import RunRecord
from reprorl.store.rollouts import DISCARDED_EVENT, find_parts
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
    for path, _, digest in find_parts(record.path):
        # A part's name is the sha256 of its bytes: hashing them finds any damage, without opening
        # the Parquet file (every later read of the store checks the rest of it).
        try:
            actual = file_hash(path).removeprefix(HASH_PREFIX)
        except OSError as exc:
            parts[path.relative_to(record.path).as_posix()] = f"cannot read rollout part {path}: {exc}"
            continue
        if actual != digest:
            parts[path.relative_to(record.path).as_posix()] = (
                f"rollout part {path} is corrupt: its sha256 is {actual[:16]}…, its name says {digest[:16]}…"
            )
    offset, line_no = _first_bad_line(record.path / "metrics.jsonl", metrics_upto)
    return Damage(parts, offset, line_no)


def _find_damage_apart(record: RunRecord, metrics_upto: int) -> Damage:
    """`find_damage` in a child interpreter: reading every record in this process before its first
    sampling was measured to move that batch's logprobs by an ulp in some resumes."""
    code = (
        "import json, sys; from pathlib import Path; from reprorl.store import Store, RunRecord; "
        "from reprorl.orchestrate.run.resume_point import find_damage; "
        "d = find_damage(RunRecord(Store(Path(sys.argv[1])), sys.argv[2]), metrics_upto=int(sys.argv[3])); "
        "print(json.dumps([d.parts, d.metrics_offset, d.metrics_line]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(record.store.root), record.run_id, str(metrics_upto)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "REPRORL_DB_URL": record.store.db_url},
    )
    if done.returncode != 0:
        raise RecordError(f"run {record.run_id}: checking its records failed: {done.stderr.strip()[-300:]}")
    parts, offset, line = json.loads(done.stdout.strip().splitlines()[-1])
    return Damage(dict(parts), offset, line)


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
    damage = _find_damage_apart(record, _newest_length(candidates))
    if damage:
        record.event(
            "records_damaged",
            parts=sorted(damage.parts),
            reasons=[damage.parts[p] for p in sorted(damage.parts)],
            metrics_line=damage.metrics_line,
        )
    checkpoint: Checkpoint | None = None
    keep: frozenset[str] = frozenset()
    # Newest first, each verified only when the ones after it were passed over.
    for path in candidates:
        try:
            candidate = Checkpoint(path, verify_checkpoint(path))
        except RecordError as exc:
            record.event("checkpoint_damaged", path=path.name, error=str(exc))
            continue
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


def _newest_length(candidates: list[Path]) -> int:
    """The longest metrics length a checkpoint records (0 with none readable): the lines a resume
    could keep. Read from each `loop.json` alone, before any checkpoint is verified."""
    lengths = [0]
    for path in candidates:
        try:
            lengths.append(int(json.loads((path / LOOP_FILE).read_text())["metrics_bytes"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return max(lengths)


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
