"""Run records: ids, the files a record holds, tamper detection, status, and the environment."""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest

from reprorl.errors import RecordError, RunNotFoundError
from reprorl.hashing import content_hash
from reprorl.store import RunRecord, Store, find_run, iter_runs, new_run_id, read_log
from reprorl.store.environment import capture_environment

SPEC: dict[str, Any] = {"name": "demo", "seed": 7, "tasks": "calc-train@sha256:" + "a" * 64, "lr": 1e-4}
RECORD_FILES = {"spec.json", "run.json", "status.json", "checksums.json", "metrics.jsonl", "events.jsonl"}


def create(store: Store, spec: dict[str, Any] | None = None, **kwargs: Any) -> RunRecord:
    spec = SPEC if spec is None else spec
    return RunRecord.create(
        store,
        spec=spec,
        spec_hash=content_hash(spec),
        name=kwargs.pop("name", "demo"),
        seeds=kwargs.pop("seeds", {"global": 7}),
        **kwargs,
    )


# -- ids -------------------------------------------------------------------------------------------


def test_run_ids_are_unique_and_sort_by_creation_time() -> None:
    ids = [new_run_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert sorted(ids) == ids
    stamp, _, suffix = ids[0].partition("-")
    assert len(stamp) == len("20250101T000000000000Z") and stamp.endswith("Z")
    assert len(suffix) == 6 and all(c in "0123456789abcdef" for c in suffix)


def test_records_list_newest_first(store: Store) -> None:
    made = [create(store).run_id for _ in range(5)]
    assert list(iter_runs(store)) == made[::-1]
    assert [e.run_id for e in store.registry.runs()] == made[::-1]
    assert find_run(store, made[2]).run_id == made[2]
    with pytest.raises(RunNotFoundError, match="matches 5 runs"):
        find_run(store, made[0][:4])  # the year is common to all
    with pytest.raises(RunNotFoundError):
        find_run(store, "19990101")
    with pytest.raises(RunNotFoundError):
        RunRecord(store, "no-such-run")


# -- creation --------------------------------------------------------------------------------------


def test_create_writes_the_record(store: Store) -> None:
    inputs = {"tasks": "sha256:" + "a" * 64}
    record = create(store, inputs=inputs, seeds={"global": 7, "sampler": 8})
    assert record.path == store.runs_dir / record.run_id
    assert {p.name for p in record.path.iterdir()} == RECORD_FILES

    info = record.info()
    assert info["format"] == "reprorl.run/1"
    assert info["run_id"] == record.run_id
    assert info["spec_hash"] == content_hash(SPEC)
    assert info["seeds"] == {"global": 7, "sampler": 8}
    assert info["inputs"] == inputs
    assert {"code", "python", "packages", "cpu"} <= set(info["environment"])
    assert record.spec() == SPEC

    sums = json.loads((record.path / "checksums.json").read_text())
    for name in ("spec.json", "run.json"):
        assert sums[name] == hashlib.sha256((record.path / name).read_bytes()).hexdigest()

    assert record.status() == {"status": "created", "updated_at": info["created_at"], "ended_at": None}
    assert record.metrics().records == []
    events = record.events()
    assert events.bad_lines == []
    assert [(e["event"], e["spec_hash"]) for e in events.records] == [("run_created", content_hash(SPEC))]

    [entry] = store.registry.runs()
    assert (entry.run_id, entry.name, entry.status, entry.spec_hash) == (
        record.run_id,
        "demo",
        "created",
        content_hash(SPEC),
    )
    assert entry.path == str(record.path)
    assert store.registry.run_artifacts(record.run_id) == inputs
    assert [p.name for p in store.runs_dir.iterdir()] == [record.run_id]  # no staging left


def test_spec_hash_mismatch_is_refused(store: Store) -> None:
    with pytest.raises(RecordError, match="does not match"):
        RunRecord.create(store, spec=SPEC, spec_hash=content_hash({**SPEC, "seed": 8}), name="x", seeds={})
    assert not store.runs_dir.exists() or list(store.runs_dir.iterdir()) == []
    assert list(iter_runs(store)) == []


def test_duplicate_run_id_is_refused(store: Store) -> None:
    record = create(store)
    with pytest.raises(RecordError, match="already exists"):
        create(store, run_id=record.run_id)
    assert record.info()["run_id"] == record.run_id


# -- tampering -------------------------------------------------------------------------------------


def test_edited_run_json_is_detected(store: Store) -> None:
    record = create(store)
    path = record.path / "run.json"
    info = json.loads(path.read_text())
    info["seeds"] = {"global": 8}
    path.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    with pytest.raises(RecordError, match=r"run\.json was altered"):
        record.info()
    with pytest.raises(RecordError):
        record.spec()


def test_edited_spec_json_is_detected(store: Store) -> None:
    record = create(store)
    path = record.path / "spec.json"
    path.write_text(path.read_text().replace('"seed":7', '"seed":8'))
    assert json.loads(path.read_text())["seed"] == 8  # still valid JSON, just different
    with pytest.raises(RecordError, match=r"spec\.json was altered"):
        record.spec()
    with pytest.raises(RecordError):
        record.info()


def test_spec_edited_along_with_its_checksum_is_still_detected(store: Store) -> None:
    record = create(store)
    spec_path = record.path / "spec.json"
    spec_path.write_text(spec_path.read_text().replace('"seed":7', '"seed":8'))
    sums_path = record.path / "checksums.json"
    sums = json.loads(sums_path.read_text())
    sums["spec.json"] = hashlib.sha256(spec_path.read_bytes()).hexdigest()
    sums_path.write_text(json.dumps(sums))
    record.info()  # the checksums now agree, but the spec no longer has the recorded hash
    with pytest.raises(RecordError, match="no longer matches its hash"):
        record.spec()


def test_missing_spec_is_reported(store: Store) -> None:
    record = create(store)
    (record.path / "spec.json").unlink()
    with pytest.raises(RecordError, match="missing"):
        record.spec()


def test_altered_metric_line_is_a_bad_line(store: Store) -> None:
    record = create(store)
    for step in range(4):
        record.log_metrics(step, {"loss": 1.0 / (step + 1)}, split="train")
    metrics = record.metrics()
    assert metrics.bad_lines == []
    assert [(m["step"], m["loss"], m["split"]) for m in metrics.records] == [
        (0, 1.0, "train"),
        (1, 0.5, "train"),
        (2, 1 / 3, "train"),
        (3, 0.25, "train"),
    ]

    path = record.path / "metrics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    assert b'"loss": 0.5' in lines[1]
    lines[1] = lines[1].replace(b'"loss": 0.5', b'"loss": 0.4')
    path.write_bytes(b"".join(lines))

    metrics = record.metrics()
    assert metrics.bad_lines == [2]
    assert [m["step"] for m in metrics.records] == [0, 2, 3]


def test_append_after_a_torn_line_stays_whole(store: Store) -> None:
    record = create(store)
    record.event("first")
    path = record.path / "events.jsonl"
    with path.open("ab") as handle:
        handle.write(b'{"rec": {"event": "torn"')  # what a crash mid-append leaves behind
    record.event("after_crash", n=1)
    events = record.events()
    assert events.bad_lines == [3]
    assert [e["event"] for e in events.records] == ["run_created", "first", "after_crash"]
    assert path.read_bytes().endswith(b"\n")


def test_read_log_reports_garbage_lines(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    assert read_log(path).records == []  # a missing log is empty
    good = b'{"rec": {"a": 1}, "sha": "015abd7f5cc57a2d"}\n'
    path.write_bytes(good + b"not json\n" + b'{"sha": "x"}\n' + b"[1]\n" + b"\xff\xfe\n" + good)
    result = read_log(path)
    assert result.records == [{"a": 1}, {"a": 1}]
    assert result.bad_lines == [2, 3, 4, 5]


def test_write_json_refuses_paths(store: Store) -> None:
    record = create(store)
    target = record.write_json("summary.json", {"reward": 0.5})
    assert json.loads(target.read_text()) == {"reward": 0.5}
    for bad in ("../escape.json", ".hidden", "sub/x.json"):
        with pytest.raises(RecordError):
            record.write_json(bad, {})
    assert not (store.runs_dir / "escape.json").exists()


# -- status ----------------------------------------------------------------------------------------


def test_status_transitions_are_recorded(tmp_path: Path, registry_url: str) -> None:
    store = Store(root=tmp_path / "home", db_url=registry_url)
    try:
        record = create(store)
        record.set_status("running", pid=123)
        status = record.status()
        assert (status["status"], status["ended_at"], status["pid"]) == ("running", None, 123)
        [entry] = store.registry.runs()
        assert (entry.status, entry.ended_at) == ("running", None)

        record.set_status("succeeded", reward=0.75)
        status = record.status()
        assert status["status"] == "succeeded"
        assert status["ended_at"] is not None
        assert status["reward"] == 0.75
        [entry] = store.registry.runs()
        assert entry.status == "succeeded"
        assert entry.ended_at is not None
        assert entry.ended_at.isoformat() == status["ended_at"]

        with pytest.raises(RecordError, match="unknown run status"):
            record.set_status("exploded")  # type: ignore[arg-type]
        assert record.status()["status"] == "succeeded"

        events = record.events()
        assert events.bad_lines == []
        assert [(e["event"], e.get("status")) for e in events.records] == [
            ("run_created", None),
            ("status", "running"),
            ("status", "succeeded"),
        ]
        assert events.records[1]["pid"] == 123
        # The status file is not one of the immutable files: changing it keeps the record valid.
        record.info()
    finally:
        store.close()


# -- environment -----------------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        [
            "git",
            "-c",
            "user.name=Test",
            "-c",
            "user.email=test@example.com",
            "-c",
            "commit.gpgsign=false",
            *args,
        ],
        cwd=repo,
        capture_output=True,
        check=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    return done.stdout.decode()


def test_environment_has_software_and_hardware(tmp_path: Path) -> None:
    env = capture_environment(cwd=tmp_path)  # not inside a git repository
    assert env["python"].split()[0].count(".") == 2
    assert Path(env["executable"]).exists()
    assert "pydantic" in env["packages"]
    assert "sqlalchemy" in env["packages"]
    assert env["cpu"]["count"] >= 1
    assert env["cpu"]["model"]
    assert isinstance(env["gpus"], list)
    assert env["code"]["cwd"] is None
    json.dumps(env)  # plain JSON


def test_environment_records_git_state(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "train.py").write_text("lr = 0.1\n")
    _git(repo, "add", "train.py")
    _git(repo, "commit", "-q", "-m", "first")
    head = _git(repo, "rev-parse", "HEAD").strip()

    clean = capture_environment(cwd=repo)["code"]["cwd"]
    assert clean["commit"] == head
    assert clean["dirty"] is False
    assert "diff" not in clean
    assert Path(clean["root"]).resolve() == repo.resolve()

    (repo / "train.py").write_text("lr = 0.2\n")
    (repo / "notes.txt").write_text("new file\n")
    dirty = capture_environment(cwd=repo)["code"]["cwd"]
    assert dirty["commit"] == head
    assert dirty["dirty"] is True
    assert "-lr = 0.1" in dirty["diff"]
    assert "+lr = 0.2" in dirty["diff"]
    assert dirty["diff_truncated"] is False
    assert dirty["untracked"] == ["notes.txt"]


def test_environment_masks_secrets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("REPRORL_DB_URL", "postgresql+psycopg://alice:hunter2@db.example:5432/reprorl")
    monkeypatch.setenv("REPRORL_CACHE_URL", "redis://:s3cret-pw@cache.example:6379/0")
    monkeypatch.setenv("REPRORL_API_TOKEN", "tok-123456")
    monkeypatch.setenv("REPRORL_HOME", "/data/reprorl")
    monkeypatch.setenv("UNRELATED_PASSWORD", "not-captured")
    env = capture_environment(cwd=tmp_path)["env"]
    assert env["REPRORL_DB_URL"] == "postgresql+psycopg://alice:***@db.example:5432/reprorl"
    assert env["REPRORL_CACHE_URL"] == "redis://:***@cache.example:6379/0"
    assert env["REPRORL_API_TOKEN"] == "***"
    assert env["REPRORL_HOME"] == "/data/reprorl"
    assert "UNRELATED_PASSWORD" not in env
    dumped = json.dumps(env)
    for secret in ("hunter2", "s3cret-pw", "tok-123456", "not-captured"):
        assert secret not in dumped


def test_run_record_does_not_store_the_db_password(monkeypatch: pytest.MonkeyPatch, store: Store) -> None:
    # Made at run time: a literal would also appear in the git diff that run.json records.
    password = secrets.token_hex(8)
    monkeypatch.setenv("REPRORL_DB_URL", f"postgresql+psycopg://alice:{password}@db.example:5432/reprorl")
    record = create(store)  # the store was given its own root and SQLite registry before the env var
    text = (record.path / "run.json").read_text()
    assert password not in text
    assert record.info()["environment"]["env"]["REPRORL_DB_URL"].endswith("alice:***@db.example:5432/reprorl")


def test_ids_made_in_the_same_microsecond_keep_creation_order() -> None:
    from datetime import UTC, datetime

    instant = datetime(2030, 1, 1, tzinfo=UTC)
    ids = [new_run_id(instant) for _ in range(50)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 50


def test_non_finite_metrics_are_kept(store: Store) -> None:
    record = create(store)
    record.log_metrics(1, {"loss": float("nan"), "grad_norm": float("inf")})
    result = record.metrics()
    assert result.bad_lines == []
    value = result.records[0]
    assert value["loss"] != value["loss"] and value["grad_norm"] == float("inf")


def test_retry_after_a_killed_create_with_the_same_id(store: Store) -> None:
    run_id = new_run_id()
    store.runs_dir.mkdir(parents=True)
    leftover = store.runs_dir / f".tmp-{run_id}"
    leftover.mkdir()
    (leftover / "spec.json").write_text("{half")
    record = create(store, run_id=run_id)
    assert record.run_id == run_id and not leftover.exists()
    assert list(iter_runs(store)) == [run_id]


def test_status_reindexes_a_run_missing_from_the_registry(store: Store) -> None:
    from reprorl.store.registry import RunRow

    record = create(store)
    with store.registry.session() as s:  # as if the process died before indexing the run
        s.delete(s.get(RunRow, record.run_id))
    assert not store.registry.has_run(record.run_id)
    record.set_status("running")
    assert store.registry.runs()[0].status == "running"
    assert store.registry.run_artifacts(record.run_id) == record.info()["inputs"]


def test_registry_run_errors_are_reprorl_errors(store: Store) -> None:
    from reprorl.errors import RegistryError
    from reprorl.store import RunEntry

    record = create(store)
    entry = store.registry.runs()[0]
    with pytest.raises(RegistryError, match="already in the registry"):
        store.registry.add_run(RunEntry(**{**entry.__dict__}), {})
    with pytest.raises(RunNotFoundError):
        store.registry.set_run_status("nope", "running", None)
    assert record.status()["status"] == "created"


def test_a_shadowed_package_is_recorded_at_the_version_python_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib
    import sys

    for folder, version in (("first", "1.0.0"), ("second", "2.0.0")):
        (tmp_path / folder / "shadowpkg").mkdir(parents=True)
        (tmp_path / folder / "shadowpkg" / "__init__.py").write_text(f"VERSION = {version!r}\n")
        info = tmp_path / folder / f"Shadow_Pkg-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: Shadow_Pkg\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "second"))
    monkeypatch.syspath_prepend(str(tmp_path / "first"))
    monkeypatch.delitem(sys.modules, "shadowpkg", raising=False)
    imported = importlib.import_module("shadowpkg").VERSION
    assert imported == "1.0.0"
    assert capture_environment(cwd=tmp_path)["packages"]["shadow-pkg"] == imported
