"""The dashboard's parts on their own: a growing log, quick filters as SQL, access rules, heat buckets."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from fastapi import HTTPException

from reprorl.dashboard.conversation import bucket
from reprorl.dashboard.filters import RolloutFilters
from reprorl.dashboard.security import Access, checked_run_id, checked_segment, inside, is_loopback
from reprorl.errors import UserInputError
from reprorl.store.log_tail import LogTail
from reprorl.store.runs import checksummed_line, new_run_id
from reprorl.types import Message, Role, Task


def test_log_tail_reads_only_what_was_appended_and_waits_for_a_whole_line(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    tail = LogTail(log)
    assert tail.refresh() == 0 and tail.records == []  # no file yet
    log.write_bytes(checksummed_line({"step": 0}) + checksummed_line({"step": 1}))
    assert tail.refresh() == 2 and [r["step"] for r in tail.records] == [0, 1]
    line = checksummed_line({"step": 2})
    with log.open("ab") as handle:
        handle.write(line[:10])  # a writer halfway through its line
    assert tail.refresh() == 0 and tail.lines == 2
    with log.open("ab") as handle:
        handle.write(line[10:] + b'{"sha": "0000", "rec": {"step": 3}}\n')
    assert tail.refresh() == 1 and tail.records[-1] == {"step": 2}
    assert tail.bad_lines == [4] and tail.lines == 4  # an edited line is counted, never read
    # A file replaced by another (a new inode, even a longer one) is read again from its start.
    fresh = tmp_path / "fresh.jsonl"
    fresh.write_bytes(b"".join(checksummed_line({"step": 9 + i}) for i in range(5)))
    fresh.replace(log)
    assert tail.refresh() == 5 and tail.records[0] == {"step": 9} and tail.bad_lines == []


def test_quick_filters_become_one_condition_of_checked_values() -> None:
    tasks = {
        "sha256:a": Task(id="a", family="sql", prompt=(Message(role=Role.USER, content="q"),)),
        "sha256:b": Task(id="b", family="files", prompt=(Message(role=Role.USER, content="q"),)),
    }
    assert RolloutFilters().condition(tasks) is None
    condition = RolloutFilters(
        where="n_turns > 1",
        split="eval",
        step=3,
        termination="tool_timeout",
        failure="bad_arguments",
        reward_min=0.5,
        reward_max=1.0,
        family="sql",
        task="it's",
    ).condition(tasks)
    assert condition == (
        "(n_turns > 1) AND split = 'eval' AND step = 3 AND termination = 'tool_timeout' AND "
        "list_contains(tool_outcomes, 'bad_arguments') AND reward_total >= 0.5 AND reward_total <= 1.0 "
        "AND task_hash IN ('sha256:a') AND task_id = 'it''s'"
    )
    assert RolloutFilters(family="calculator").condition(tasks) == "FALSE"
    assert "score_failure" in (RolloutFilters(failure="verifier_timeout").condition(tasks) or "")
    for bad in (
        {"split": "x' OR 1=1 --"},
        {"termination": "done"},
        {"failure": "ok"},
        {"reward_min": math.inf},
        {"reward_max": math.nan},
        {"step": -1},
        {"page": 0},
        {"per_page": 501},
    ):
        with pytest.raises(HTTPException) as caught:
            RolloutFilters(**bad)  # type: ignore[arg-type]
        assert caught.value.status_code == 400 and str(caught.value.detail).startswith(f"{next(iter(bad))}: ")
    assert RolloutFilters(split="eval", page=3).query(page=4) == "split=eval&page=4"


def test_access_needs_a_token_off_loopback_and_loopback_hosts_on_it() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.5.0.1", "::1", "[::1]", "localhost", "LOCALHOST"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.0.0.1", "example.com", "localhost.evil.com", ""))
    local = Access.for_bind("127.0.0.1", 8765)
    assert local.token is None and local.token_ok(None)
    assert (
        local.host_allowed("127.0.0.1:8765")
        and local.host_allowed("localhost")
        and local.host_allowed("[::1]:80")
    )
    assert not local.host_allowed("attacker.example:8765") and not local.host_allowed("")
    remote = Access.for_bind("0.0.0.0", 8765)
    assert remote.token and remote.token != Access.for_bind("0.0.0.0", 8765).token
    assert not remote.token_ok(None) and not remote.token_ok("") and remote.token_ok(remote.token)
    assert remote.host_allowed("dashboard.example:8765")  # the token guards it instead
    assert Access.for_bind("0.0.0.0", 1, token="chosen-token-0123").token == "chosen-token-0123"
    for weak in ("", "short", "x" * 15, "a;Domain=evil.example", "tab\there-and-long-enough"):
        with pytest.raises(UserInputError, match="token"):
            Access.for_bind("0.0.0.0", 1, token=weak)


def test_names_that_would_build_a_path_are_refused(tmp_path: Path) -> None:
    run = new_run_id()
    assert checked_run_id(run) == run
    for bad in (
        "..",
        ".",
        "",
        "a/b",
        "a\\b",
        "x\x00",
        "20261204T000000000000Z-zzzzzz",
        run + "\n",
        run + "/..",
    ):
        with pytest.raises(HTTPException):
            checked_run_id(bad)
    assert checked_segment("plotly.js", "name") == "plotly.js"
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path)
    assert inside(tmp_path / "root", "a") == (tmp_path / "root" / "a").resolve()
    with pytest.raises(HTTPException):
        inside(tmp_path / "root", "link")


def test_heat_buckets_follow_the_token_probability() -> None:
    assert bucket(0.0) == 0 and bucket(math.log(0.95)) == 0
    assert bucket(math.log(0.5)) == 5 and bucket(math.log(0.01)) == 9
    assert bucket(-math.inf) == 9 and bucket(math.nan) == 9 and bucket(0.3) == 0
    assert [bucket(math.log(p)) for p in (0.9, 0.7, 0.3, 0.11)] == sorted(
        bucket(math.log(p)) for p in (0.9, 0.7, 0.3, 0.11)
    )


def test_what_is_built_from_a_run_waits_for_a_change_and_always_shows_its_end(tmp_path: Path) -> None:
    from reprorl.dashboard.reader import StoreReader
    from reprorl.hashing import content_hash
    from reprorl.store import RunRecord, Store

    store = Store(tmp_path / "home")
    try:
        record = RunRecord.create(store, spec={}, spec_hash=content_hash({}), name="r", seeds={"run": 0})
        reader = StoreReader(store)
        builds: list[int] = []

        def build() -> int:
            builds.append(len(builds))
            return len(builds)

        cache = reader.run(record.run_id)
        assert cache.built("x", build) == 1 and cache.built("x", build) == 1  # nothing changed
        record.log_metrics(0, {"loss": 1.0})
        cache = reader.run(record.run_id)
        assert cache.built("x", build) == 2  # the log grew; the last build was quick
        record.log_metrics(1, {"loss": 0.5})
        cache = reader.run(record.run_id)
        assert cache.built("x", build, patience=1e9) == 2  # grew again, but too soon after the last build
        record.set_status("succeeded")
        cache = reader.run(record.run_id)
        assert cache.built("x", build, patience=1e9) == 3  # the end is always shown
    finally:
        store.close()
