"""Guarded sinks: each sink runs on its own thread behind a queue, so it can never fail or stall its caller.

The caller only enqueues. The worker opens the sink, delivers the lines in order and closes it. A
sink that raises, or that spends longer than `timeout_s` on one call (opening included), or falls
`max_pending` lines behind, is disabled: it gets nothing more and `failure` says why. A stuck worker
is abandoned (it is a daemon thread), never waited on past its timeout.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from reprorl.sinks.base import MetricSink, deliver

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_PENDING = 100_000


class GuardedSink:
    """One sink behind a worker thread; `submit` never blocks and never raises."""

    def __init__(
        self,
        label: str,
        opener: Callable[[], MetricSink],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_pending: int | None = DEFAULT_MAX_PENDING,
    ) -> None:
        self.label = label
        self.timeout_s = timeout_s
        self.max_pending = max_pending
        self.delivered = 0
        self._opener = opener
        self._queue: queue.SimpleQueue[tuple[str, dict[str, Any]] | None] = queue.SimpleQueue()  # None: close
        self._failure: str | None = None
        self._busy_since: float | None = time.monotonic()  # opening counts as a call
        self._done = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._work, name=f"reprorl-sink {label}", daemon=True)
        self._thread.start()

    @property
    def failure(self) -> str | None:
        """Why this sink was disabled, or None while it works."""
        self._check_stall()
        return self._failure

    def submit(self, log: str, line: Mapping[str, Any]) -> None:
        """Queue one record line (`log` is "metrics" or "event") for the sink."""
        if self.failure is not None or self._closing:
            return
        if self.max_pending is not None and self._queue.qsize() >= self.max_pending:
            self._fail(f"fell {self.max_pending} lines behind the run")
            return
        self._queue.put((log, dict(line)))

    def request_close(self) -> None:
        """Accept no more lines; the sink closes once what is queued is delivered."""
        if not self._closing:
            self._closing = True
            self._queue.put(None)

    def close(self) -> None:
        """Deliver what is queued and close the sink, giving up on a call that takes over `timeout_s`."""
        self.request_close()
        while not self._done.wait(0.05):
            if self.failure is not None:
                return

    def _fail(self, reason: str) -> None:
        if self._failure is None:
            self._failure = reason

    def _check_stall(self) -> None:
        busy = self._busy_since
        if self._failure is None and busy is not None and time.monotonic() - busy > self.timeout_s:
            self._fail(f"no answer within {self.timeout_s:g} s")

    def _work(self) -> None:
        step = "opening it"
        try:
            sink = self._opener()
            self._busy_since = None
            while True:
                item = self._queue.get()
                if self._failure is not None:
                    return
                if item is None:
                    step = "closing it"
                    self._busy_since = time.monotonic()
                    sink.close()
                    self._busy_since = None
                    return
                log, line = item
                step = f"writing a {'metric line' if log == 'metrics' else 'run event'}"
                self._busy_since = time.monotonic()
                deliver(sink, log, line)
                self._busy_since = None
                self.delivered += 1
        except Exception as exc:
            self._fail(f"{step} raised {type(exc).__name__}: {' '.join(str(exc).split())}"[:500])
        finally:
            self._busy_since = None
            self._done.set()
