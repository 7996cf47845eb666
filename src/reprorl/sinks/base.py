"""Metric sinks: places a run's metric lines and events are mirrored to for viewing, never read back.

A sink receives what the run record holds, in the record's own names: each metric line as
(step, stage, numeric figures, the line's other fields as tags) and each event by name. The record
stays the source of truth; a sink can lag, fail or be left out without changing the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from reprorl.errors import ReprorlError
from reprorl.store import RunRecord

# Fields every metric line carries that are coordinates, not figures.
LINE_FIELDS = ("step", "time", "stage")


class SinkError(ReprorlError, RuntimeError):
    """A sink could not take a run's metrics (raised by `export_run`; a live run only records it)."""


@runtime_checkable
class MetricSink(Protocol):
    """Where metric lines and events go. `event` may do nothing; `close` flushes and ends the sink's run.

    The named parameters are positional-only: tags and event fields are whatever the record holds,
    so a field called `name` or `step` must not collide with them.
    """

    def log(self, step: int, stage: str | None, metrics: Mapping[str, float], /, **tags: Any) -> None: ...

    def event(self, name: str, /, **fields: Any) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class SinkRun:
    """The run a sink mirrors: what a sink names its own run after and records as its configuration."""

    run_id: str
    name: str
    spec_hash: str
    spec: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_record(cls, record: RunRecord) -> SinkRun:
        info = record.info()
        return cls(record.run_id, str(info["name"]), str(info["spec_hash"]), record.spec())


class SinkFactory(Protocol):
    """Opens one sink for a run; `label` names it in warnings (e.g. `tensorboard:runs/tb`)."""

    @property
    def label(self) -> str: ...

    def open(self, run: SinkRun) -> MetricSink: ...


def split_line(line: Mapping[str, Any]) -> tuple[int, str | None, dict[str, float], dict[str, Any]]:
    """A metric line as (step, stage, figures, tags): numbers are figures, everything else a tag."""
    metrics: dict[str, float] = {}
    tags: dict[str, Any] = {}
    for key, value in line.items():
        if key in LINE_FIELDS:
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics[key] = float(value)
        else:
            tags[key] = value
    if "time" in line:
        tags["time"] = line["time"]
    stage = line.get("stage")
    return int(line["step"]), str(stage) if stage is not None else None, metrics, tags


def deliver(sink: MetricSink, log: str, line: Mapping[str, Any]) -> None:
    """Hand one record line to a sink: a metric line to `log`, an event to `event`."""
    if log == "metrics":
        step, stage, metrics, tags = split_line(line)
        sink.log(step, stage, metrics, **tags)
    else:
        fields = {k: v for k, v in line.items() if k != "event"}
        sink.event(str(line["event"]), **fields)


def wall_time(tags: Mapping[str, Any]) -> float | None:
    """The line's recorded time as Unix seconds, when it has one."""
    stamp = tags.get("time")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None
