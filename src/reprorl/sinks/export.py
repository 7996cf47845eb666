"""After the fact: a recorded run's metric lines and events replayed into sinks, in the order written.

The same sinks and guard as a live run. Lines of either log that fail their checksum are skipped and
counted, never mirrored; a sink that fails makes the export fail (the run record is not touched).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reprorl.sinks.base import SinkError, SinkFactory, SinkRun
from reprorl.sinks.guard import DEFAULT_TIMEOUT_S, GuardedSink
from reprorl.store import RunRecord


@dataclass(frozen=True)
class Export:
    run_id: str
    sinks: tuple[str, ...]
    metric_lines: int
    events: int
    bad_lines: int  # torn or altered lines of either log, left out

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "sinks": list(self.sinks),
            "metric_lines": self.metric_lines,
            "events": self.events,
            "bad_lines": self.bad_lines,
        }


def export_run(
    record: RunRecord, factories: Sequence[SinkFactory], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Export:
    """Replay `record`'s metrics.jsonl and events.jsonl into each sink; `SinkError` if any fails."""
    run = SinkRun.from_record(record)
    metrics, events = record.metrics(), record.events()
    # Both logs stamp each line with the same clock; a stable merge on it keeps the run's own order.
    lines = sorted(
        [("metrics", line) for line in metrics.records] + [("event", line) for line in events.records],
        key=lambda item: str(item[1].get("time", "")),
    )
    sinks = [
        GuardedSink(f.label, functools.partial(f.open, run), timeout_s=timeout_s, max_pending=None)
        for f in factories
    ]
    for log, line in lines:
        for sink in sinks:
            sink.submit(log, line)
    for sink in sinks:
        sink.request_close()
    for sink in sinks:
        sink.close()
    failed = [f"{s.label}: {s.failure}" for s in sinks if s.failure is not None]
    if failed:
        raise SinkError(f"export of run {record.run_id} failed: {'; '.join(failed)}")
    return Export(
        record.run_id,
        tuple(s.label for s in sinks),
        len(metrics.records),
        len(events.records),
        len(metrics.bad_lines) + len(events.bad_lines),
    )
