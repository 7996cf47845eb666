"""The rollout store: round trips, SQL queries, integrity and version checks, a sandboxed WHERE."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from reprorl.errors import IntegrityError, NotFoundError, RecordError, UserInputError
from reprorl.hashing import content_hash
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.store.rollout_sql import step_windows
from reprorl.store.rollouts import (
    COLUMNS,
    META_VERSION,
    ROLLOUT_SCHEMA_VERSION,
    SUMMARY_COLUMNS,
    PartFile,
    RolloutWriter,
    parquet_bytes,
    to_table,
)
from reprorl.types import ToolOutcome, Trajectory
from rollout_records import RUN, batch


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "runs" / RUN
    path.mkdir(parents=True)
    return path


@pytest.fixture
def written(run_dir: Path) -> dict[int, list[Trajectory]]:
    steps = {0: batch(0), 1: batch(1), 2: batch(2, n=3)}
    writer = RolloutWriter(run_dir)
    for step, trajectories in steps.items():
        writer.write(step, trajectories)
    return steps


def ids(table: pa.Table) -> list[str]:
    return [str(v) for v in table.column("rollout_id").to_pylist()]


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# -- round trip and layout -------------------------------------------------------------------------


def test_round_trip_restores_every_trajectory_exactly(
    run_dir: Path, written: dict[int, list[Trajectory]]
) -> None:
    store = RolloutStore(run_dir)
    everything = [t for step in sorted(written) for t in written[step]]
    assert store.count() == len(everything) == 15
    for original in everything:
        assert store.get(original.rollout_id) == original
    assert list(store.trajectories()) == sorted(everything, key=lambda t: t.rollout_id)
    with pytest.raises(NotFoundError, match="no rollout 'nope'"):
        store.get("nope")


def test_files_are_partitioned_by_step_and_named_by_their_checksum(
    run_dir: Path, written: dict[int, list[Trajectory]]
) -> None:
    parts = RolloutStore(run_dir).parts()
    assert [(p.step, p.rows) for p in parts] == [(0, 6), (1, 6), (2, 3)]
    for part in parts:
        assert part.path.parent.name == f"step={part.step:06d}"
        assert part.path.name == f"part-{hashlib.sha256(part.path.read_bytes()).hexdigest()}.parquet"
        assert part.path.parent.parent == run_dir / "rollouts"


def test_writing_the_same_batch_again_is_idempotent(
    run_dir: Path, written: dict[int, list[Trajectory]]
) -> None:
    again = RolloutWriter(run_dir).write(1, written[1])
    assert again is not None and again.path.exists()
    assert RolloutStore(run_dir).count() == 15
    assert RolloutWriter(run_dir).write(3, []) is None
    assert not (run_dir / "rollouts" / "step=000003").exists()


def test_a_run_record_gets_a_checksummed_manifest_event(store: Store) -> None:
    spec = {"name": "demo"}
    record = RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name="demo", seeds={"g": 1})
    part = RolloutWriter(record).write(4, batch(4, run_id=record.run_id))
    assert part is not None
    events = [e for e in record.events().records if e["event"] == "rollouts_written"]
    assert len(events) == 1
    assert events[0]["sha256"] == part.sha256 and events[0]["rows"] == 6 and events[0]["step"] == 4
    assert (record.path / events[0]["part"]) == part.path
    assert RolloutStore(record).count() == 6
    # A part the log says was written must still be there.
    part.path.unlink()
    with pytest.raises(RecordError, match="was written, now missing"):
        RolloutStore(record).count()


def test_a_long_lived_store_follows_the_log_and_parses_each_line_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import reprorl.store.log_tail as log_tail

    spec = {"name": "demo"}
    record = RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name="demo", seeds={"g": 1})
    writer = RolloutWriter(record)
    parsed: list[bytes] = []
    real = log_tail.parse_log_line
    monkeypatch.setattr(log_tail, "parse_log_line", lambda raw: parsed.append(raw) or real(raw))
    rollouts = RolloutStore(record)
    first = writer.write(0, batch(0, run_id=record.run_id))
    assert first is not None and rollouts.count() == 6
    seen = len(parsed)
    assert rollouts.count() == 6 and len(parsed) == seen  # nothing appended: nothing parsed again
    writer.write(1, batch(1, run_id=record.run_id))
    assert rollouts.count() == 12 and len(parsed) == seen + 1  # only the new line
    # A discarded part stops counting for the store that already read the line that wrote it.
    record.event("rollouts_discarded", parts=[first.path.relative_to(record.path).as_posix()])
    first.path.unlink()
    assert rollouts.count() == 6
    # A log replaced by a shorter one is read again from its start, and what it no longer says goes.
    log = record.path / "events.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    written = [i for i, line in enumerate(lines) if b"rollouts_written" in line]
    fresh = record.path / "fresh.jsonl"
    fresh.write_bytes(b"".join(lines[: written[0]]))
    fresh.replace(log)
    assert rollouts.count() == 6  # the step-1 part is still on disk, and an unlogged part counts
    assert rollouts.ledger() == (frozenset(), frozenset())


def test_whole_records_are_read_in_windows_of_steps_in_the_same_order(
    run_dir: Path, written: dict[int, list[Trajectory]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import reprorl.store.rollout_query as rollout_query

    store = RolloutStore(run_dir)
    whole = [t.rollout_id for t in store.trajectories()]
    first_two = [t.rollout_id for t in store.trajectories(limit=8)]
    timed_out = [t.rollout_id for t in store.trajectories("list_contains(tool_outcomes, 'tool_timeout')")]
    pages = [store.query(limit=4, offset=o) for o in (0, 4, 12, 15)]
    failed = store.query("reward_total = 0", columns=["rollout_id", "step"])
    monkeypatch.setattr(rollout_query, "WINDOW_BYTES", 1)  # a window per step
    monkeypatch.setattr(rollout_query, "WINDOW_FILES", 1)
    assert [store.query(limit=4, offset=o) for o in (0, 4, 12, 15)] == pages
    assert [p.num_rows for p in pages] == [4, 4, 3, 0] and store.query(limit=0).num_rows == 0
    assert store.query("reward_total = 0", columns=["rollout_id", "step"]) == failed
    assert store.count() == 15 and store.count("reward_total = 0") == failed.num_rows
    assert len(step_windows(store.parts(), 1)) == 3
    assert [t.rollout_id for t in store.trajectories()] == whole and len(whole) == 15
    assert [t.rollout_id for t in store.trajectories(limit=8)] == first_two == whole[:8]
    assert [t.rollout_id for t in store.trajectories(limit=0)] == []
    assert [
        t.rollout_id for t in store.trajectories("list_contains(tool_outcomes, 'tool_timeout')")
    ] == timed_out
    # A condition that closes its parenthesis stays inside each window: every row comes once.
    assert [t.rollout_id for t in store.trajectories("FALSE) OR (TRUE")] == whole


def test_windows_spread_a_merged_part_over_its_steps_and_never_split_a_step() -> None:
    def part(step: int, size: int, last: int | None = None) -> PartFile:
        return PartFile(Path(f"p{step}"), step, "0" * 64, 1, size, last)

    merged, after = part(0, 100, last=9), part(10, 30)
    windows = step_windows([merged, part(10, 5), after], 30)
    assert [span for _, span in windows] == [(0, 2), (3, 5), (6, 8), (9, 10)]
    assert [len(files) for files, _ in windows] == [1, 1, 1, 3]
    assert step_windows([merged], 10**9) == [([merged], (0, 9))]


def test_a_rollout_stored_in_two_steps_is_reported(
    run_dir: Path, written: dict[int, list[Trajectory]]
) -> None:
    RolloutWriter(run_dir).write(5, written[0][:1])
    with pytest.raises(RecordError, match="is stored 2 times"):
        RolloutStore(run_dir).get(written[0][0].rollout_id)


def test_writer_refuses_foreign_duplicate_and_badly_stepped_batches(run_dir: Path) -> None:
    writer = RolloutWriter(run_dir)
    with pytest.raises(RecordError, match="belongs to run 'other'"):
        writer.write(0, batch(0, run_id="other"))
    twice = batch(0, n=1) * 2
    with pytest.raises(RecordError, match="appears twice"):
        writer.write(0, twice)
    with pytest.raises(RecordError, match="step must be an integer >= 0"):
        writer.write(-1, batch(0))
    assert not (run_dir / "rollouts").exists() or not list((run_dir / "rollouts").rglob("*.parquet"))


def test_an_empty_run_queries_as_an_empty_table(run_dir: Path) -> None:
    store = RolloutStore(run_dir)
    assert store.count() == 0
    table = store.query("termination = 'answered'")
    assert table.num_rows == 0 and tuple(table.column_names) == SUMMARY_COLUMNS
    with pytest.raises(NotFoundError):
        store.get("r1")


def test_an_empty_run_has_the_columns_and_types_of_a_written_one(tmp_path: Path) -> None:
    """The empty view is declared in SQL; its every column and type is what the part files give."""
    empty, full = tmp_path / "empty" / "runs" / RUN, tmp_path / "full" / "runs" / RUN
    empty.mkdir(parents=True)
    full.mkdir(parents=True)
    RolloutWriter(full).write(0, batch(0))
    declared = RolloutStore(empty).query(columns=list(COLUMNS)).schema
    stored = RolloutStore(full).query(columns=list(COLUMNS)).schema
    assert [(f.name, f.type) for f in declared] == [(f.name, f.type) for f in stored]


PROBE = """
import faulthandler, resource, sys
import duckdb, psutil
from pathlib import Path
from reprorl.store.rollout_query import RolloutStore
from reprorl.store.rollout_sql import step_windows
faulthandler.enable()  # a crash in native code names where it was
store = RolloutStore(Path(sys.argv[1]))
mapped = psutil.Process().memory_info().vms
# Room for the main thread's own allocations, never for a new thread's stack (RLIMIT_STACK
# large, 8 MiB by default): one MiB short of a stack. Less room leaves DuckDB and Arrow at the
# edge of their own allocations, where a native library may crash instead of refusing.
stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
room = 7 << 20 if stack == resource.RLIM_INFINITY else max(stack - (1 << 20), 4 << 20)
resource.setrlimit(resource.RLIMIT_AS, (mapped + room, resource.RLIM_INFINITY))
print(store.count())
try:
    print(store.query().num_rows)
except duckdb.OutOfMemoryException as exc:  # refused: the cap left no room for the result
    print("refused")
# The answers are in; the cap is lifted before teardown, which is the libraries' (their exit
# handlers may start threads and, refused, crash the interpreter after the test has its answer).
sys.stdout.flush()
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
"""


def test_an_empty_run_queries_where_no_thread_can_start(run_dir: Path) -> None:
    """Under an address-space limit no new thread's stack fits: the empty run still answers (an
    Arrow scan there waits for ever, or fails and crashes the interpreter at exit)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(run_dir)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    count, rows = done.stdout.split()
    assert count == "0" and rows in ("0", "refused")


def test_paths_with_quotes_are_safe(tmp_path: Path) -> None:
    run_id = "o'brien-run"
    run_dir = tmp_path / "it's here" / run_id
    RolloutWriter(run_dir).write(0, batch(0, run_id=run_id))
    assert RolloutStore(run_dir).count("termination = 'answered'") == 2  # answered, recovered


# -- queries ---------------------------------------------------------------------------------------


def test_queries_by_termination_tool_outcome_and_step(
    run_dir: Path, written: dict[int, list[Trajectory]]
) -> None:
    store = RolloutStore(run_dir)
    everything = [t for step in sorted(written) for t in written[step]]

    def expect(predicate: object) -> list[str]:
        assert callable(predicate)
        return sorted(t.rollout_id for t in everything if predicate(t))

    assert ids(store.query("termination='tool_timeout'")) == expect(lambda t: t.termination == "tool_timeout")
    any_timeout = expect(lambda t: ToolOutcome.TOOL_TIMEOUT in t.tool_outcomes())
    assert ids(store.query("list_contains(tool_outcomes, 'tool_timeout')")) == any_timeout
    assert len(any_timeout) == 6  # the timed-out ones and the recovered ones
    failed_with_timeout = ids(
        store.query("reward_total = 0 AND list_contains(tool_outcomes, 'tool_timeout')")
    )
    assert failed_with_timeout == expect(
        lambda t: (
            t.reward is not None and t.reward.total == 0 and ToolOutcome.TOOL_TIMEOUT in t.tool_outcomes()
        )
    )
    assert ids(store.query("step = 2")) == sorted(t.rollout_id for t in written[2])
    assert ids(store.query("step >= 1 AND split = 'eval'")) == expect(
        lambda t: t.split == "eval" and int(t.rollout_id[-4:]) >= 100
    )
    assert ids(store.query("reward_total IS NULL")) == expect(lambda t: t.reward is None)
    assert ids(store.query("reward_components['format'] = 1.0")) == expect(
        lambda t: t.reward is not None and t.reward.components.get("format") == 1.0
    )
    sql_timeouts = "len(list_filter(tool_calls, c -> c.tool = 'sql' AND c.outcome = 'tool_timeout')) > 0"
    assert ids(store.query(sql_timeouts)) == any_timeout
    assert ids(store.query("n_truncated_turns > 0")) == expect(lambda t: t.termination == "max_tokens")
    assert ids(store.query("json_extract_string(record, '$.sandbox.isolation') = 'unshare'")) == expect(
        lambda t: True
    )
    assert store.count("  ") == 15  # blank means no condition


def test_columns_types_order_and_limit(run_dir: Path, written: dict[int, list[Trajectory]]) -> None:
    store = RolloutStore(run_dir)
    table = store.query(columns=["step", "rollout_id", "tool_outcomes", "seed", "reward_components"], limit=4)
    assert table.column_names == ["step", "rollout_id", "tool_outcomes", "seed", "reward_components"]
    assert table.schema.field("step").type == pa.int64()
    assert table.schema.field("tool_outcomes").type == pa.list_(pa.string())
    rows = table.to_pylist()
    assert [r["step"] for r in rows] == [0, 0, 0, 0]
    assert rows[1]["tool_outcomes"] == ["ok", "tool_timeout"]
    assert rows[0]["seed"] == 2**62
    assert store.query(columns="rollout_id, termination").column_names == ["rollout_id", "termination"]
    assert store.query(limit=0).num_rows == 0
    full = store.query("termination = 'infra_error'", columns=["record", "error", "infra_retries"])
    first = full.to_pylist()[0]
    assert Trajectory.model_validate_json(first["record"]).error == first["error"]
    assert first["infra_retries"] == 2
    with pytest.raises(UserInputError, match="columns: unknown column 'bogus'; known: schema_version"):
        store.query(columns=["rollout_id", "bogus"])
    with pytest.raises(UserInputError, match="limit: must be an integer >= 0"):
        store.query(limit=-1)


def test_to_pandas_needs_pandas(run_dir: Path, written: dict[int, list[Trajectory]]) -> None:
    store = RolloutStore(run_dir)
    if importlib.util.find_spec("pandas") is None:
        with pytest.raises(UserInputError, match="pandas is not installed"):
            store.to_pandas()
    else:
        assert len(store.to_pandas("step = 0")) == 6


# -- WHERE is one condition on the rollout table, nothing else -------------------------------------


def unsafe_conditions(tmp_path: Path) -> list[str]:
    target = tmp_path / "stolen.csv"
    return [
        f"1=1; COPY (SELECT * FROM rollouts) TO '{target}'",
        f"1=1) ; COPY (SELECT 1) TO '{target}' ; SELECT 1 WHERE (1=1",
        "EXISTS (SELECT * FROM read_csv('/etc/passwd'))",
        "rollout_id IN (SELECT column0 FROM read_csv_auto('/etc/passwd', header=false))",
        "EXISTS (FROM glob('/*'))",
        f"EXISTS (FROM query('COPY (SELECT 1) TO ''{target}'''))",
        "1=1) UNION ALL (SELECT * FROM read_parquet('/etc/passwd')",
        "1=1) ORDER BY (1",
        "1=1) GROUP BY (1",
        "1=1; SET enable_external_access = true",
        f"1=1; ATTACH '{tmp_path / 'x.db'}' AS x",
        "1=1; INSTALL httpfs",
        "1=1 /*",
        "termination = ",
        "no_such_column = 1",
        "termination = 1",
        "sum(wall_s) > 0",
    ]


def test_malformed_or_unsafe_conditions_are_refused_and_write_nothing(
    tmp_path: Path, run_dir: Path, written: dict[int, list[Trajectory]]
) -> None:
    store = RolloutStore(run_dir)
    before = files_under(tmp_path)
    for condition in unsafe_conditions(tmp_path):
        with pytest.raises(UserInputError) as caught:
            store.query(condition)
        message = str(caught.value)
        assert message.startswith("where: ") and "\n" not in message, (condition, message)
    assert files_under(tmp_path) == before
    assert store.count() == 15  # and the store still answers


def test_refusals_name_the_problem(run_dir: Path, written: dict[int, list[Trajectory]]) -> None:
    store = RolloutStore(run_dir)
    with pytest.raises(UserInputError, match='syntax error at or near ";"'):
        store.count("1=1; DROP TABLE rollouts")
    with pytest.raises(UserInputError, match="may read only the rollout table"):
        store.count("EXISTS (FROM read_csv('/etc/passwd'))")
    with pytest.raises(UserInputError, match="may not close the parenthesis"):
        store.count("1=1) UNION ALL (SELECT 1")
    with pytest.raises(UserInputError, match=r'column "n_turn" not found.*Candidate bindings: "n_turns"'):
        store.count("n_turn = 1")


# -- integrity and versions ------------------------------------------------------------------------


def flip_byte(path: Path, offset: int | None = None) -> None:
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["middle", "footer"])
def test_a_flipped_byte_is_detected_on_read(
    run_dir: Path, written: dict[int, list[Trajectory]], where: str
) -> None:
    part = RolloutStore(run_dir).parts()[1]
    flip_byte(part.path, None if where == "middle" else part.size - 20)
    store = RolloutStore(run_dir)
    for read in (store.count, store.query, lambda: store.get(written[0][0].rollout_id)):
        with pytest.raises(IntegrityError, match="is corrupt") as caught:
            read()
        assert str(part.path) in str(caught.value) and "\n" not in str(caught.value)
        assert caught.value.expected == part.sha256


def test_a_long_lived_store_notices_a_changed_file(
    run_dir: Path, written: dict[int, list[Trajectory]]
) -> None:
    store = RolloutStore(run_dir)
    assert store.count() == 15
    part = store.parts()[0]
    flip_byte(part.path)
    os.utime(part.path, ns=(time.time_ns(), time.time_ns() + 1000))
    with pytest.raises(IntegrityError):
        store.count()


def put_part(run_dir: Path, step: int, trajectories: list[Trajectory], version: bytes | None = None) -> Path:
    """A part as a writer of another version or run would leave it, under its correct checksum."""
    table = to_table(trajectories[0].run_id, step, trajectories)
    if version is not None:
        table = table.replace_schema_metadata({**table.schema.metadata, META_VERSION: version})
    data = parquet_bytes(table)
    path = run_dir / "rollouts" / f"step={step:06d}" / f"part-{hashlib.sha256(data).hexdigest()}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (ROLLOUT_SCHEMA_VERSION + 1, "newer than v1 that this reprorl reads; upgrade reprorl"),
        (0, "knows no upgrade from it to v1"),
        ("x", "has no valid schema version"),
    ],
)
def test_unknown_schema_versions_are_refused(run_dir: Path, version: object, message: str) -> None:
    RolloutWriter(run_dir).write(0, batch(0))
    put_part(run_dir, 1, batch(1), version=str(version).encode())
    with pytest.raises(RecordError, match=message):
        RolloutStore(run_dir).count()


def test_the_schema_version_is_a_column_too(run_dir: Path, written: dict[int, list[Trajectory]]) -> None:
    versions = RolloutStore(run_dir).query(columns=["schema_version"]).column("schema_version").to_pylist()
    assert set(versions) == {ROLLOUT_SCHEMA_VERSION}


def test_moved_or_foreign_parts_are_refused(run_dir: Path, written: dict[int, list[Trajectory]]) -> None:
    part = RolloutStore(run_dir).parts()[0]
    moved = run_dir / "rollouts" / "step=000009" / part.path.name
    moved.parent.mkdir()
    part.path.rename(moved)
    with pytest.raises(RecordError, match="holds step 0, not 9"):
        RolloutStore(run_dir).count()
    moved.unlink()
    put_part(run_dir, 5, batch(5, run_id="another-run"))
    with pytest.raises(RecordError, match="belongs to run 'another-run'"):
        RolloutStore(run_dir).count()


def test_a_part_with_a_bad_name_is_reported(run_dir: Path, written: dict[int, list[Trajectory]]) -> None:
    (run_dir / "rollouts" / "step=000000" / "part-1234.parquet").write_bytes(b"x")
    with pytest.raises(RecordError, match="is not a rollout part name"):
        RolloutStore(run_dir).count()


def test_every_example_in_the_docs_runs(run_dir: Path, written: dict[int, list[Trajectory]]) -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "rollouts.md").read_text()
    examples = doc.split("## Examples", 1)[1].split("##", 1)[0]
    conditions = [
        snippet
        for line in examples.splitlines()
        if line.startswith("| ") and "`" in line and not line.startswith("| question")
        for snippet in line.split(" | ")[1].split("`")[1::2]
    ]
    assert len(conditions) >= 12
    store = RolloutStore(run_dir)
    for condition in conditions:
        store.count(condition)
    assert store.count("list_max([c.duration_s for c in tool_calls]) > 1.5") == 6  # the timeouts took 2 s
