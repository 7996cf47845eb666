"""Live sinks: a run-record observer that mirrors one run's lines into sinks while it trains.

Attach it with `RunRecord.observing(observer)` around the training call: the loop itself knows
nothing of sinks, and the spec (so the spec hash) never mentions them. Lines reach the sinks after
they are durably in the record. A sink that fails is disabled and one `sink_disabled` warning event
naming it and the reason is recorded on the run; training goes on.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import Any

from reprorl.sinks.base import SinkFactory, SinkRun
from reprorl.sinks.guard import DEFAULT_MAX_PENDING, DEFAULT_TIMEOUT_S, GuardedSink
from reprorl.store import RunRecord
from reprorl.store.runs import LogName

DISABLED_EVENT = "sink_disabled"


class SinkObserver:
    """Follows one run: `run_id`, or else the first run that writes a line once it is attached."""

    def __init__(
        self,
        factories: Sequence[SinkFactory],
        *,
        run_id: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_pending: int | None = DEFAULT_MAX_PENDING,
    ) -> None:
        self.factories = list(factories)
        self.run_id = run_id
        self.timeout_s = timeout_s
        self.max_pending = max_pending
        self.sinks: list[GuardedSink] = []
        self._record: RunRecord | None = None
        self._reported: set[int] = set()  # ids of the sinks whose failure is on the record
        self._closed = False
        self._lock = threading.RLock()  # an event recorded here calls back in on the same thread

    def __call__(self, record: RunRecord, log: LogName, line: dict[str, Any]) -> None:
        with self._lock:
            if self._closed or record.run_id != (self.run_id or record.run_id):
                return
            if self._record is None:
                self._start(record)
            for sink in self.sinks:
                sink.submit(log, line)
            self._report()

    def close(self) -> list[tuple[str, str]]:
        """Flush and close every sink; returns (sink, reason) for each one that was disabled."""
        with self._lock:
            if self._closed:
                return self.failures()
            self._report()  # while the other sinks still take the warning
            self._closed = True
        for sink in self.sinks:
            sink.request_close()
        for sink in self.sinks:
            sink.close()
        with self._lock:
            self._report()
        return self.failures()

    def failures(self) -> list[tuple[str, str]]:
        return [(s.label, s.failure) for s in self.sinks if s.failure is not None]

    def _start(self, record: RunRecord) -> None:
        self.run_id, self._record = record.run_id, record
        run = SinkRun.from_record(record)
        self.sinks = [
            GuardedSink(
                factory.label,
                functools.partial(factory.open, run),
                timeout_s=self.timeout_s,
                max_pending=self.max_pending,
            )
            for factory in self.factories
        ]

    def _report(self) -> None:
        """Record each newly disabled sink once, as a warning event on the run."""
        if self._record is None:
            return
        for sink in self.sinks:
            reason = sink.failure
            if reason is not None and id(sink) not in self._reported:
                self._reported.add(id(sink))
                self._record.event(DISABLED_EVENT, level="warning", sink=sink.label, reason=reason)
