"""Work off the event loop: a lost wake-up, a dead worker or a thread team made mid-run never hangs a run."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch

from reprorl.threads import POLL_S, Workers, WorkerThreadLost, _Job, native_thread, off_loop, settled


def _os_threads() -> int:
    return sum(1 for _ in Path("/proc/self/task").iterdir())


def test_a_result_whose_wake_up_was_refused_is_still_collected(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        real = loop.call_soon_threadsafe

        def refused(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not threading.main_thread():
                raise MemoryError  # the allocation the wake-up needs is refused
            return real(*args, **kwargs)

        monkeypatch.setattr(loop, "call_soon_threadsafe", refused)
        future: Future[int] = Future()
        threading.Thread(target=lambda: (time.sleep(0.05), future.set_result(7))).start()
        started = time.perf_counter()
        # The stock wrapper never wakes: prove the wake-up really is lost, then that `settled` copes.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), 3 * POLL_S)
        assert any("exception calling callback" in r.getMessage() for r in caplog.records)
        caplog.clear()
        value = await asyncio.wait_for(settled(future), 4 * POLL_S)
        later: Future[int] = Future()
        waiting = asyncio.ensure_future(settled(later))
        await asyncio.sleep(0)
        threading.Thread(target=later.set_result, args=(8,)).start()  # its wake-up refused too
        assert await asyncio.wait_for(waiting, 4 * POLL_S) == 8
        return value, time.perf_counter() - started

    with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
        value, waited = asyncio.run(main())
    # Nothing was logged from the refusing thread: logging a refused allocation can stall them all.
    assert not caplog.records
    assert value == 7
    assert waited < 6 * POLL_S


def test_off_loop_returns_values_and_raises_errors_of_its_call() -> None:
    async def main() -> tuple[str, BaseException | None]:
        name = await off_loop(lambda: threading.current_thread().name)
        try:
            await off_loop(int, "not a number")
        except ValueError as exc:
            return name, exc
        return name, None

    name, error = asyncio.run(main())
    assert name.startswith("reprorl-io")
    assert isinstance(error, ValueError)


class _Refusing(_Job):
    def run(self) -> None:
        self.thread = threading.current_thread()
        raise MemoryError("refused while taking the work")


def test_a_worker_that_dies_with_work_unfinished_is_an_error_naming_why() -> None:
    workers = Workers("test-dies")
    job = _Refusing(Future(), lambda: 1)
    workers._jobs.put(job)
    deadline = time.monotonic() + 5
    while workers.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not workers.alive()
    with pytest.raises(WorkerThreadLost) as raised:
        workers._check(job)
    assert isinstance(raised.value.__cause__, MemoryError)  # classified as memory by the run

    async def waits_on_the_dead() -> None:
        await workers.run(lambda: 1)

    # Work sent after the death is never taken: it is not waited for for ever either.
    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(waits_on_the_dead(), 3 * POLL_S))


def test_a_group_starts_all_its_threads_at_once_and_shares_out_the_work() -> None:
    before = threading.active_count()
    workers = Workers("test-group", 3)
    assert threading.active_count() == before + 3  # none is left to start mid-run
    release = threading.Event()
    names: list[str] = []

    def hold() -> None:
        names.append(threading.current_thread().name)
        release.wait(5)

    jobs = [workers.submit(hold) for _ in range(3)]
    deadline = time.monotonic() + 5
    while len(names) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    for job in jobs:
        job.future.result(5)
    assert sorted(names) == ["test-group-0", "test-group-1", "test-group-2"]
    workers.stop()


def test_the_named_thread_is_reused_and_replaced_only_once_dead() -> None:
    first = native_thread("test-reuse")
    assert native_thread("test-reuse") is first
    assert first.call(lambda: threading.current_thread().name) == "reprorl-test-reuse"
    assert first.call(lambda: first.call(lambda: 3)) == 3  # work sent from the thread runs inline
    first.stop()
    deadline = time.monotonic() + 5
    while first.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    second = native_thread("test-reuse")
    assert second is not first and second.alive()


def test_the_thread_team_is_made_when_the_thread_starts_not_at_its_first_parallel_work() -> None:
    if torch.get_num_threads() < 2:
        pytest.skip("one intra-op thread: no team to make")
    thread = native_thread("test-team")
    before = _os_threads()
    thread.call(lambda: torch.ones(1 << 18).mul_(2))
    assert _os_threads() == before
    # Without the warm-up a fresh thread's first parallel region does start threads: the check
    # above can fail.
    counts: list[int] = []

    def first_parallel_work() -> None:
        counts.append(_os_threads())
        torch.ones(1 << 18).mul_(2)
        counts.append(_os_threads())
        release.wait(5)

    release = threading.Event()
    fresh = threading.Thread(target=first_parallel_work)
    fresh.start()
    while len(counts) < 2 and fresh.is_alive():
        time.sleep(0.01)
    release.set()
    fresh.join()
    assert counts[1] > counts[0]
