"""Sinks never fail or stall a run: the record's observer hook, the guard, the live observer, export.

The sinks here are small real classes (no third-party package): one records what it gets, one raises,
one blocks until released.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from reprorl.hashing import content_hash
from reprorl.sinks import DISABLED_EVENT, MetricSink, SinkError, SinkObserver, SinkRun, export_run
from reprorl.store import RunRecord, Store
from reprorl.store.runs import LogName

SPEC: dict[str, Any] = {"name": "sinks", "seed": 1}


def new_run(tmp_path: Path, name: str = "sinks") -> RunRecord:
    spec = {**SPEC, "name": name}
    store = Store(tmp_path / "home")
    return RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name=name, seeds={"root": 1})


class Recording:
    """Keeps every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.closed = False

    def log(self, step: int, stage: str | None, metrics: Mapping[str, float], /, **tags: Any) -> None:
        self.calls.append(("log", step, stage, dict(metrics)))

    def event(self, name: str, /, **fields: Any) -> None:
        self.calls.append(("event", name))

    def close(self) -> None:
        self.closed = True


class Raising(Recording):
    def log(self, step: int, stage: str | None, metrics: Mapping[str, float], /, **tags: Any) -> None:
        raise ConnectionError("tracking server went away")


class Blocking(Recording):
    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def log(self, step: int, stage: str | None, metrics: Mapping[str, float], /, **tags: Any) -> None:
        self.release.wait()


class Factory:
    """A sink factory handing out one given sink (or raising when it is opened)."""

    def __init__(self, label: str, sink: MetricSink | None) -> None:
        self.label = label
        self.sink = sink
        self.runs: list[SinkRun] = []

    def open(self, run: SinkRun) -> MetricSink:
        self.runs.append(run)
        if self.sink is None:
            raise PermissionError("cannot write there")
        return self.sink


def disabled(record: RunRecord) -> list[dict[str, Any]]:
    return [e for e in record.events().records if e["event"] == DISABLED_EVENT]


def wait_for_failures(observer: SinkObserver, count: int) -> dict[str, str]:
    """The sinks' worker threads fail on their own time; wait (bounded) until `count` have."""
    deadline = time.monotonic() + 10
    while len(observer.failures()) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return dict(observer.failures())


# -- the record's observer hook ----------------------------------------------------------------------


def test_observers_see_each_line_after_it_is_on_disk_and_a_raising_one_is_dropped(tmp_path: Path) -> None:
    record = new_run(tmp_path)
    seen: list[tuple[LogName, dict[str, Any], bool]] = []

    def watch(rec: RunRecord, log: LogName, line: dict[str, Any]) -> None:
        on_disk = (rec.metrics() if log == "metrics" else rec.events()).records[-1] == line
        seen.append((log, line, on_disk))
        line["step"] = "changed"  # a copy: the record and other observers keep the original

    def broken(rec: RunRecord, log: LogName, line: dict[str, Any]) -> None:
        raise RuntimeError("observer bug")

    with RunRecord.observing(watch), RunRecord.observing(broken):
        record.log_metrics(4, {"loss": 0.5}, stage="sft")
        record.event("checkpoint", step=4)
    record.log_metrics(5, {"loss": 0.25})  # no longer observed

    assert [(log, on_disk) for log, _, on_disk in seen] == [
        ("metrics", True),
        ("event", True),
        ("event", True),
    ]
    # The broken observer goes at its first line, with one event that the other one sees too.
    assert [line["event"] for _, line, _ in seen[1:]] == ["observer_failed", "checkpoint"]
    assert record.metrics().records[0]["step"] == 4
    failed = [e for e in record.events().records if e["event"] == "observer_failed"]
    assert len(failed) == 1 and failed[0]["error"] == "RuntimeError: observer bug"
    assert "broken" in failed[0]["observer"]


# -- live sinks ----------------------------------------------------------------------------------------


def test_a_raising_sink_is_disabled_with_one_warning_and_the_run_goes_on(tmp_path: Path) -> None:
    good, bad = Recording(), Raising()
    observer = SinkObserver([Factory("good:x", good), Factory("bad:y", bad)], timeout_s=10)
    with RunRecord.observing(observer):
        record = new_run(tmp_path)
        record.log_metrics(0, {"reward_mean": 0.0})
        wait_for_failures(observer, 1)
        for step in range(1, 20):
            record.log_metrics(step, {"reward_mean": step / 10})
        record.set_status("succeeded")
        failures = observer.close()

    assert failures == [("bad:y", "writing a metric line raised ConnectionError: tracking server went away")]
    (warning,) = disabled(record)
    assert (warning["level"], warning["sink"], warning["reason"]) == ("warning", "bad:y", failures[0][1])
    assert len(record.metrics().records) == 20 and record.status()["status"] == "succeeded"
    logged = [c for c in good.calls if c[0] == "log"]
    assert [c[1] for c in logged] == list(range(20)) and good.closed
    assert ("event", "run_created") in good.calls and ("event", DISABLED_EVENT) in good.calls


def test_a_stalled_sink_is_given_up_on_without_holding_the_run(tmp_path: Path) -> None:
    release = threading.Event()
    stuck, good = Blocking(release), Recording()
    observer = SinkObserver([Factory("stuck:x", stuck), Factory("good:y", good)], timeout_s=0.3)
    try:
        with RunRecord.observing(observer):
            record = new_run(tmp_path)
            started = time.monotonic()
            record.log_metrics(0, {"loss": 1.0})
            time.sleep(0.5)
            record.log_metrics(1, {"loss": 0.5})
            failures = observer.close()
            assert time.monotonic() - started < 3.0
    finally:
        release.set()
    assert failures == [("stuck:x", "no answer within 0.3 s")]
    assert [w["sink"] for w in disabled(record)] == ["stuck:x"]
    assert [c[1] for c in good.calls if c[0] == "log"] == [0, 1]


def test_a_sink_that_cannot_open_or_falls_behind_is_disabled(tmp_path: Path) -> None:
    release = threading.Event()
    observer = SinkObserver(
        [Factory("closed:x", None), Factory("slow:y", Blocking(release))], timeout_s=30, max_pending=2
    )
    try:
        with RunRecord.observing(observer):
            record = new_run(tmp_path)
            for step in range(5):
                record.log_metrics(step, {"loss": 1.0})
            reasons = wait_for_failures(observer, 2)
    finally:
        release.set()
        observer.close()
    assert reasons == {
        "closed:x": "opening it raised PermissionError: cannot write there",
        "slow:y": "fell 2 lines behind the run",
    }
    assert sorted(w["sink"] for w in disabled(record)) == ["closed:x", "slow:y"]


def test_an_observer_follows_one_run_only(tmp_path: Path) -> None:
    sink = Recording()
    factory = Factory("r:x", sink)
    observer = SinkObserver([factory])
    with RunRecord.observing(observer):
        first = new_run(tmp_path, "first")
        new_run(tmp_path, "second").log_metrics(0, {"loss": 9.0})
        first.log_metrics(0, {"loss": 1.0})
        observer.close()
    assert [run.run_id for run in factory.runs] == [first.run_id]
    assert factory.runs[0].spec == {**SPEC, "name": "first"}
    assert [c[3] for c in sink.calls if c[0] == "log"] == [{"loss": 1.0}]


# -- export --------------------------------------------------------------------------------------------


def test_export_replays_both_logs_in_order_and_a_failing_sink_fails_it(tmp_path: Path) -> None:
    record = new_run(tmp_path)
    record.log_metrics(0, {"sft_loss": 2.0}, stage="sft")
    record.event("sft_done")
    record.log_metrics(0, {"reward_mean": 0.5}, policy_version="p", metrics="a tag")
    record.event("named", name="a field", step=1)
    sink = Recording()
    result = export_run(record, [Factory("r:x", sink)])
    assert (result.metric_lines, result.events, result.bad_lines) == (2, 3, 0)
    assert sink.calls == [
        ("event", "run_created"),
        ("log", 0, "sft", {"sft_loss": 2.0}),
        ("event", "sft_done"),
        ("log", 0, None, {"reward_mean": 0.5}),
        ("event", "named"),  # fields named like the sink's own parameters reach it as fields
    ]
    assert sink.closed

    with pytest.raises(SinkError, match="bad:y: writing a metric line raised ConnectionError"):
        export_run(record, [Factory("r:x", Recording()), Factory("bad:y", Raising())])
    assert disabled(record) == []  # an export never writes to the run it reads
