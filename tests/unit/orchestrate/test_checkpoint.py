"""Checkpoints: sealed with checksums, a damaged one passed over, a rewind that discards what came after."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprorl.errors import RecordError
from reprorl.hashing import content_hash
from reprorl.orchestrate.run.checkpoint import (
    LoopState,
    latest_checkpoint,
    rewind,
    save_checkpoint,
    verify_checkpoint,
)
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.store.rollouts import RolloutWriter
from rollout_records import batch


@pytest.fixture
def record(tmp_path: Path) -> RunRecord:
    spec = {"name": "ckpt"}
    return RunRecord.create(Store(tmp_path), spec=spec, spec_hash=content_hash(spec), name="ckpt", seeds={})


def _writer(payload: bytes):  # type: ignore[no-untyped-def]
    def write(folder: Path) -> None:
        (folder / "state.bin").write_bytes(payload)

    return write


def _state(record: RunRecord, next_step: int) -> LoopState:
    size = (record.path / "metrics.jsonl").stat().st_size
    return LoopState(next_step=next_step, metrics_bytes=size, policy_version=f"v{next_step}")


def test_a_checkpoint_is_sealed_and_the_oldest_are_pruned(record: RunRecord) -> None:
    for step in (1, 2, 3):
        save_checkpoint(record, _state(record, step), _writer(b"x" * step), keep=2)
    names = sorted(p.name for p in (record.path / "checkpoints").iterdir())
    assert names == ["step-000002", "step-000003"]
    latest = latest_checkpoint(record)
    assert latest is not None and latest.state.next_step == 3 and latest.state.policy_version == "v3"
    assert (latest.path / "state.bin").read_bytes() == b"xxx"


def test_a_damaged_checkpoint_is_passed_over_and_named(record: RunRecord) -> None:
    save_checkpoint(record, _state(record, 1), _writer(b"good"), keep=3)
    newest = save_checkpoint(record, _state(record, 2), _writer(b"good"), keep=3)
    (newest.path / "state.bin").write_bytes(b"evil")
    with pytest.raises(RecordError, match=r"state\.bin does not match"):
        verify_checkpoint(newest.path)
    latest = latest_checkpoint(record)
    assert latest is not None and latest.state.next_step == 1
    damaged = [e for e in record.events().records if e["event"] == "checkpoint_damaged"]
    assert damaged and damaged[0]["path"] == "step-000002"


def test_rewind_cuts_metrics_and_discards_rollouts_after_the_checkpoint(record: RunRecord) -> None:
    writer = RolloutWriter(record)
    record.log_metrics(0, {"loss": 1.0})
    writer.write(0, batch(0, run_id=record.run_id))
    checkpoint = save_checkpoint(record, _state(record, 1), _writer(b"s"))
    record.log_metrics(1, {"loss": 0.5})
    writer.write(1, batch(1, run_id=record.run_id))
    record.log_metrics(2, {"loss": 0.25})  # the run was killed during step 2

    assert rewind(record, checkpoint) == 1
    assert [m["step"] for m in record.metrics().records] == [0]
    rollouts = RolloutStore(record)
    assert rollouts.count() == 6 and rollouts.count("step = 1") == 0  # logged, then discarded: no error
    discarded = [e for e in record.events().records if e["event"] == "rollouts_discarded"]
    assert len(discarded) == 1 and discarded[0]["from_step"] == 1 and len(discarded[0]["parts"]) == 1

    # The step runs again and writes the same part: it counts once.
    writer.write(1, batch(1, run_id=record.run_id))
    assert RolloutStore(record).count("step = 1") == 6


def test_rewind_without_a_checkpoint_starts_over(record: RunRecord) -> None:
    record.log_metrics(0, {"sft_loss": 2.0}, stage="sft")
    RolloutWriter(record).write(0, batch(0, run_id=record.run_id))
    assert rewind(record, None) == 0
    assert record.metrics().records == [] and RolloutStore(record).count() == 0
