"""Where a resume starts: past a damaged rollout part or metrics line it goes back to an earlier
checkpoint (or the start), never keeping a record that no longer reads back as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprorl.errors import ResourceExhaustedError
from reprorl.hashing import content_hash
from reprorl.orchestrate.run.checkpoint import Checkpoint, LoopState, rewind, save_checkpoint
from reprorl.orchestrate.run.exhaustion import exhausted
from reprorl.orchestrate.run.resume_point import find_damage, resume_checkpoint
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.store.rollouts import RolloutWriter, find_parts
from rollout_records import batch


@pytest.fixture
def record(tmp_path: Path) -> RunRecord:
    spec = {"name": "resume"}
    return RunRecord.create(Store(tmp_path), spec=spec, spec_hash=content_hash(spec), name="resume", seeds={})


def _write_state(folder: Path) -> None:
    (folder / "state.bin").write_bytes(b"s")


def _steps(record: RunRecord, steps: int) -> None:
    """`steps` steps, each a metrics line, a part and a checkpoint after it (the newest 3 kept)."""
    writer = RolloutWriter(record)
    for step in range(steps):
        record.log_metrics(step, {"loss": 1.0 / (step + 1)})
        writer.write(step, batch(step, run_id=record.run_id))
        size = (record.path / "metrics.jsonl").stat().st_size
        save_checkpoint(record, LoopState(next_step=step + 1, metrics_bytes=size), _write_state, keep=3)


def _none_kept(checkpoint: Checkpoint) -> frozenset[str]:
    return frozenset()


def _flip(path: Path, offset: int = 100) -> None:
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _events(record: RunRecord, kind: str) -> list[dict[str, object]]:
    return [e for e in record.events().records if e["event"] == kind]


def test_an_intact_run_resumes_from_its_newest_checkpoint(record: RunRecord) -> None:
    _steps(record, 4)
    (record.path / "metrics.jsonl").open("ab").write(b'{"sha": "torn')  # the kill's torn last line
    checkpoint, keep = resume_checkpoint(record, _none_kept)
    assert checkpoint is not None and checkpoint.state.next_step == 4 and keep == frozenset()
    assert not find_damage(record, metrics_upto=checkpoint.state.metrics_bytes)
    assert not _events(record, "records_damaged")
    assert rewind(record, checkpoint) == 4
    assert [m["step"] for m in record.metrics().records] == [0, 1, 2, 3]


def test_a_damaged_part_sends_the_resume_back_before_its_step(record: RunRecord) -> None:
    _steps(record, 4)
    (part, _, _), *_ = [p for p in find_parts(record.path) if p[1] == 2]
    _flip(part)
    checkpoint, _ = resume_checkpoint(record, _none_kept)
    # Checkpoints after steps 2 and 3 keep step 2's part; the one after step 1 does not.
    assert checkpoint is not None and checkpoint.state.next_step == 2
    (damaged,) = _events(record, "records_damaged")
    assert damaged["parts"] == [part.relative_to(record.path).as_posix()]
    assert "corrupt" in str(damaged["reasons"])
    passed = _events(record, "checkpoint_passed_over")
    assert [e["path"] for e in passed] == ["step-000004", "step-000003"]
    assert all("damaged rollout part" in str(e["reason"]) for e in passed)
    assert not part.exists()  # discarded, and logged with its reason
    (gone,) = [e for e in _events(record, "rollouts_discarded") if e["reason"] == "damaged"]
    assert gone["parts"] == damaged["parts"]
    assert rewind(record, checkpoint) == 2
    assert RolloutStore(record).count() == 12  # steps 0 and 1, every part verifying


def test_damage_before_every_checkpoint_starts_the_run_again(record: RunRecord) -> None:
    _steps(record, 4)  # checkpoints after steps 1, 2 and 3 are kept: none before step 0
    (part, _, _), *_ = find_parts(record.path)
    _flip(part)
    checkpoint, _ = resume_checkpoint(record, _none_kept)
    assert checkpoint is None
    assert rewind(record, checkpoint) == 0
    assert find_parts(record.path) == [] and record.metrics().records == []


def test_an_edited_metrics_line_sends_the_resume_back_before_it(record: RunRecord) -> None:
    _steps(record, 4)
    metrics = record.path / "metrics.jsonl"
    lines = metrics.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"step": 2', b'"step": 7')  # same length, checksum broken
    metrics.write_bytes(b"".join(lines))
    checkpoint, _ = resume_checkpoint(record, _none_kept)
    assert checkpoint is not None and checkpoint.state.next_step == 2
    (damaged,) = _events(record, "records_damaged")
    assert damaged["metrics_line"] == 3 and damaged["parts"] == []
    assert rewind(record, checkpoint) == 2
    assert record.metrics().bad_lines == [] and [m["step"] for m in record.metrics().records] == [0, 1]


def test_a_damaged_part_a_checkpoint_keeps_ahead_rules_that_checkpoint_out(record: RunRecord) -> None:
    _steps(record, 3)
    ahead = RolloutWriter(record).write(3, batch(3, run_id=record.run_id))  # sampled ahead of step 3
    assert ahead is not None
    name = ahead.path.relative_to(record.path).as_posix()
    _flip(ahead.path)

    def keep_of(checkpoint: Checkpoint) -> frozenset[str]:
        return frozenset({name}) if checkpoint.state.next_step == 3 else frozenset()

    checkpoint, keep = resume_checkpoint(record, keep_of)
    assert checkpoint is not None and checkpoint.state.next_step == 2 and keep == frozenset()
    assert not ahead.path.exists()


@pytest.mark.parametrize(
    ("exc", "resource"),
    [
        (OSError(28, "No space left on device"), "disk"),
        (RuntimeError("(sqlite3.OperationalError) database or disk is full"), "disk"),
        (MemoryError(), "memory"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"), "memory"),
        (type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory"), "memory"),
        (RuntimeError("could not create a primitive"), "memory"),
    ],
)
def test_running_out_of_memory_or_disk_is_one_line_naming_the_resume(exc: Exception, resource: str) -> None:
    try:
        try:
            raise exc
        except Exception as inner:
            raise ValueError("while writing a part") from inner  # found down the chain as well
    except ValueError as outer:
        failure = exhausted(outer, "RUN1", "/store")
    assert isinstance(failure, ResourceExhaustedError) and failure.resource == resource
    assert "reprorl run --resume RUN1" in str(failure) and "\n" not in str(failure)
    assert ("/store" in str(failure)) == (resource == "disk")


def test_other_failures_are_not_taken_for_exhaustion() -> None:
    assert exhausted(RuntimeError("shape mismatch"), "RUN1", "/store") is None
    assert exhausted(OSError(13, "Permission denied"), "RUN1", "/store") is None
