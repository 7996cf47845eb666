"""Damage found on resume: the rewind goes back before the earliest damaged record, so it is written again."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprorl.hashing import content_hash
from reprorl.orchestrate.run.checkpoint import Checkpoint, LoopState, rewind, save_checkpoint
from reprorl.orchestrate.run.damage import find_damage, resume_point
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.store.rollouts import RolloutWriter, find_parts
from rollout_records import batch


@pytest.fixture
def record(tmp_path: Path) -> RunRecord:
    """A run checkpointed after each of steps 0, 1 and 2, each with a metrics line and a rollout part."""
    spec = {"name": "damage"}
    store = Store(tmp_path)
    record = RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name="damage", seeds={})
    writer = RolloutWriter(record)
    for step in range(3):
        record.log_metrics(step, {"loss": 1.0 / (step + 1)})
        writer.write(step, batch(step, run_id=record.run_id))
        size = (record.path / "metrics.jsonl").stat().st_size
        state = LoopState(next_step=step + 1, metrics_bytes=size, policy_version=f"v{step + 1}")
        save_checkpoint(record, state, lambda folder: (folder / "w").write_bytes(b"w"), keep=None)
    return record


def _keep_nothing(record: RunRecord, checkpoint: Checkpoint) -> frozenset[str]:
    return frozenset()


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x02
    path.write_bytes(bytes(data))


def _events(record: RunRecord, kind: str) -> list[dict[str, object]]:
    return [e for e in record.events().records if e["event"] == kind]


def test_an_undamaged_run_resumes_from_its_newest_checkpoint(record: RunRecord) -> None:
    checkpoint, _ = resume_point(record, _keep_nothing)
    assert checkpoint is not None and checkpoint.state.next_step == 3
    assert not find_damage(record) and not _events(record, "records_damaged")


def test_a_damaged_part_before_the_newest_checkpoint_rewinds_to_before_its_step(record: RunRecord) -> None:
    path, step, _ = find_parts(record.path)[1]
    assert step == 1
    _flip(path, len(path.read_bytes()) // 2)

    checkpoint, keep = resume_point(record, _keep_nothing)
    assert checkpoint is not None and checkpoint.state.next_step == 1  # taken before step 1 ran
    (found,) = _events(record, "records_damaged")
    assert found["parts"] == [path.relative_to(record.path).as_posix()]
    assert not path.exists()  # set aside, out of every reader's view; its discard logged
    assert rewind(record, checkpoint, keep=keep) == 1
    assert [m["step"] for m in record.metrics().records] == [0]
    assert not list(record.path.glob("rollouts/*/*.damaged"))
    assert RolloutStore(record).count() == 6  # the records before the damage, each verified


def test_a_kill_after_the_damage_is_set_aside_makes_the_same_choice(record: RunRecord) -> None:
    path, _, _ = find_parts(record.path)[0]
    _flip(path, 10)
    first, _ = resume_point(record, _keep_nothing)
    # Killed before the rewind: the next resume sees the set-aside part and goes back as far.
    damage = find_damage(record)
    assert list(damage.parts.values()) == [0]
    again, _ = resume_point(record, _keep_nothing)
    assert first is None and again is None


def test_an_altered_metrics_line_before_every_checkpoint_starts_the_run_over(record: RunRecord) -> None:
    metrics = record.path / "metrics.jsonl"
    _flip(metrics, metrics.read_bytes().index(b'"loss"') + 9)  # a digit of step 0's loss
    damage = find_damage(record)
    assert damage.metrics_line == 1 and damage.metrics_offset == 0
    checkpoint, _ = resume_point(record, _keep_nothing)
    assert checkpoint is None
    assert rewind(record, None) == 0 and record.metrics().records == []


def test_metrics_cut_short_at_a_line_end_rewind_to_a_checkpoint_they_cover(record: RunRecord) -> None:
    metrics = record.path / "metrics.jsonl"
    lines = metrics.read_bytes().splitlines(keepends=True)
    metrics.write_bytes(b"".join(lines[:2]))  # step 2's line lost whole
    checkpoint, _ = resume_point(record, _keep_nothing)
    assert checkpoint is not None and checkpoint.state.next_step == 2


def test_a_damaged_part_the_checkpoint_keeps_sends_the_resume_further_back(record: RunRecord) -> None:
    path, _, _ = find_parts(record.path)[2]
    name = path.relative_to(record.path).as_posix()
    _flip(path, 10)
    asked: list[int] = []

    def keeps_step_2(record: RunRecord, checkpoint: Checkpoint) -> frozenset[str]:
        asked.append(checkpoint.state.next_step)
        return frozenset({name}) if checkpoint.state.next_step == 2 else frozenset()

    checkpoint, _ = resume_point(record, keeps_step_2)
    # Step 3's checkpoint comes after the damaged part; step 2's keeps it (sampled ahead): step 1's.
    assert asked == [3, 2, 1] and checkpoint is not None and checkpoint.state.next_step == 1
