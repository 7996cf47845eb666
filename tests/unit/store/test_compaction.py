"""Compaction: an ended run's parts merged into a few, every query answering as before, kills survived."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from reprorl.errors import IntegrityError, RecordError
from reprorl.hashing import content_hash
from reprorl.store import RunRecord, Store
from reprorl.store.compaction import check_resumable, compact
from reprorl.store.rollout_query import RolloutStore
from reprorl.store.rollouts import COMPACTED_EVENT, RolloutWriter, find_compacted, find_parts
from reprorl.types import Trajectory
from rollout_records import batch

QUERIES = (
    None,
    "termination = 'tool_timeout'",
    "reward_total = 0 AND list_contains(tool_outcomes, 'tool_timeout')",
    "step BETWEEN 3 AND 7",
    "split = 'train' AND n_tool_calls > 0",
)


def ended_run(
    store: Store, steps: int = 12, *, status: str = "succeeded"
) -> tuple[RunRecord, list[Trajectory]]:
    spec = {"name": "compaction"}
    record = RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name="c", seeds={"g": 0})
    writer = RolloutWriter(record)
    written: list[Trajectory] = []
    for step in range(steps):
        rows = batch(step, run_id=record.run_id, n=3 + step % 4)
        writer.write(step, rows)
        written += rows
        if step % 5 == 2:  # a second part in one step (an eval batch beside the train batch)
            extra = [t.model_copy(update={"rollout_id": t.rollout_id + "-eval"}) for t in rows[:2]]
            writer.write(step, extra)
            written += extra
    record.set_status(status)  # type: ignore[arg-type]
    return record, written


def answers(record: RunRecord) -> list[object]:
    rollouts = RolloutStore(record)
    out: list[object] = [rollouts.query(q).to_pylist() for q in QUERIES]
    out.append([rollouts.count(q) for q in QUERIES])
    out.append(list(rollouts.trajectories()))
    return out


def test_compaction_merges_parts_and_every_query_answers_the_same(store: Store) -> None:
    record, written = ended_run(store)
    before = answers(record)
    parts_before = RolloutStore(record).parts()
    result = compact(record, target_bytes=sum(p.size for p in parts_before) // 3)
    assert result.parts_before == len(parts_before) == 14
    assert 2 <= result.parts_after <= 4 and result.merged == result.parts_after
    assert result.rows == len(written)
    assert answers(record) == before
    assert find_parts(record.path) == []  # every per-step part replaced and removed
    spans = [(first, last) for _, first, last, _ in find_compacted(record.path)]
    assert spans[0][0] == 0 and spans[-1][1] == 11
    # The parts' rows are regrouped, not kept a row group per part (the per-group cost is the point).
    for path, *_ in find_compacted(record.path):
        assert pq.ParquetFile(path).metadata.num_row_groups == 1
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans))  # disjoint, in order
    for original in written:
        assert RolloutStore(record).get(original.rollout_id) == original
    events = [e for e in record.events().records if e["event"] == COMPACTED_EVENT]
    assert len(events) == result.merged
    assert sum(len(e["replaces"]) for e in events) == 14
    # Again: nothing left to merge, nothing changes.
    again = compact(record, target_bytes=sum(p.size for p in parts_before) // 3)
    assert (again.merged, again.parts_after, again.leftovers) == (0, result.parts_after, 0)
    assert answers(record) == before


def test_a_large_target_gives_one_part_and_a_tiny_one_keeps_steps_whole(store: Store) -> None:
    record, _ = ended_run(store)
    before = answers(record)
    tiny = compact(record, target_bytes=1)
    # One group per step: only the steps with two parts (2 and 7) merge; a step is never split.
    assert tiny.merged == 2 and tiny.parts_after == 12
    assert answers(record) == before
    # Then the single parts merge between the compacted steps, never across them: 0-1, 3-6, 8-11.
    whole = compact(record)
    assert whole.merged == 3 and whole.parts_after == 5
    spans = [(first, last) for _, first, last, _ in find_compacted(record.path)]
    assert spans == [(0, 1), (2, 2), (3, 6), (7, 7), (8, 11)]
    assert answers(record) == before


def test_only_an_ended_run_is_compacted_and_a_compacted_one_is_not_resumed(store: Store) -> None:
    record, _ = ended_run(store, status="running")
    with pytest.raises(RecordError, match="is running: only an ended run is compacted"):
        compact(record)
    assert find_compacted(record.path) == []
    check_resumable(record)  # per-step parts: resumable
    record.set_status("failed")
    compact(record)
    with pytest.raises(RecordError, match="compacted: it cannot be resumed"):
        check_resumable(record)


def test_a_flipped_byte_in_a_compacted_part_is_detected(store: Store) -> None:
    record, _ = ended_run(store)
    compact(record)
    ((path, *_),) = find_compacted(record.path)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="is corrupt"):
        RolloutStore(record).count()


def test_a_part_changed_between_listing_and_merging_stops_the_compaction(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    record, _ = ended_run(store)
    before = answers(record)
    import reprorl.store.compaction as compaction

    real = compaction._read_checked

    def tampered(part: object) -> object:
        path = part.path  # type: ignore[attr-defined]
        path.chmod(0o644)
        path.write_bytes(path.read_bytes()[:-1] + b"\0")
        compaction._read_checked = real  # once
        return real(part)  # type: ignore[arg-type]

    monkeypatch.setattr(compaction, "_read_checked", tampered)
    with pytest.raises(IntegrityError, match="changed while it was compacted"):
        compact(record)
    assert find_compacted(record.path) == []  # the temp file went with the failure
    assert not list((record.path / "rollouts").glob("steps=*/.tmp-*"))
    assert [e for e in record.events().records if e["event"] == COMPACTED_EVENT] == []
    with pytest.raises(IntegrityError):
        answers(record)  # the tampered part is reported, not hidden by a compaction
    assert before  # the run's answers before the tampering were read


KILLER = """
import os, signal, sys
from pathlib import Path
from reprorl.store import RunRecord, Store
import reprorl.store.compaction as compaction
import reprorl.store.runs as runs

store = Store(Path(sys.argv[1]))
record = RunRecord(store, sys.argv[2])
where = sys.argv[3]
if where == "before-log":
    real_event = runs.RunRecord.event
    def event(self, kind, **fields):
        if kind == "rollouts_compacted":
            os.kill(os.getpid(), signal.SIGKILL)
        return real_event(self, kind, **fields)
    runs.RunRecord.event = event
else:
    real_unlink = Path.unlink
    def unlink(self, missing_ok=False):
        if self.name.startswith("part-"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_unlink(self, missing_ok=missing_ok)
    Path.unlink = unlink
compaction.compact(record)
"""


@pytest.mark.parametrize("where", ["before-log", "before-removal"])
def test_a_compaction_killed_at_either_point_loses_and_doubles_nothing(store: Store, where: str) -> None:
    record, written = ended_run(store)
    before = answers(record)
    done = subprocess.run(
        [sys.executable, "-c", KILLER, str(store.root), record.run_id, where],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    # Killed with both the new part and the old ones on disk: the log decides which count.
    assert find_compacted(record.path) and len(find_parts(record.path)) == 14
    assert answers(record) == before
    logged = [e for e in record.events().records if e["event"] == COMPACTED_EVENT]
    assert len(logged) == (0 if where == "before-log" else 1)
    result = compact(record)
    assert result.leftovers == (1 if where == "before-log" else 14)
    assert result.rows == len(written) and find_parts(record.path) == []
    assert answers(record) == before
