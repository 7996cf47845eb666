"""Work off the event loop that a refused allocation cannot leave the run waiting on for ever.

Three failures of the stock `asyncio.to_thread` show when memory runs out mid-run. Its result
reaches the loop through a callback (`call_soon_threadsafe`) that allocates: when that allocation
is refused the work is done but the loop is never told, and the run waits with nothing left to do.
Its executor logs a failure outside the work, and logging a refused allocation on a thread that
holds the interpreter lock can stall every thread for good. And it starts threads on demand, so
native work (a decode, an update) lands on a thread met for the first time mid-run, whose OpenMP
team and stack must then be made: allocations a full address space refuses, in code that aborts
the process instead of raising.

So here every wait also polls the work's own state (a lost wake-up costs at most `POLL_S`), a
worker thread that died with its work unfinished becomes an error, no worker logs, every group's
threads start together when it is made, and the native work of each kind runs on one long-lived
thread per process (`native_thread`), its OpenMP team made when it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, cast

__all__ = ["POLL_S", "WorkerThreadLost", "Workers", "native_thread", "off_loop", "settled"]

P = ParamSpec("P")
T = TypeVar("T")

POLL_S = 0.5

IO = "io"
IO_THREADS = 8  # blocking calls in flight at once; episodes beyond wait their turn
_threads: dict[str, Workers] = {}
_threads_lock = threading.Lock()


class WorkerThreadLost(RuntimeError):
    """The thread doing a piece of work ended without finishing it (raised from what ended it)."""


async def settled(future: Future[T], worker: Callable[[], threading.Thread | None] = lambda: None) -> T:
    """The result of `future`, run on another thread, awaited without trusting its wake-up alone.

    The wake-up swallows its own failure: a callback that raises is logged by `concurrent.futures`,
    and logging a refused allocation on a thread that holds the interpreter lock can stall every
    thread. `worker` names the thread running the work once it has started; if that thread is gone
    while the work is unfinished, `WorkerThreadLost` is raised instead of waiting for ever.
    """
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()

    def wake(_: Future[T]) -> None:
        with contextlib.suppress(MemoryError, RuntimeError):  # refused, or the loop closed: polled
            loop.call_soon_threadsafe(woken.set)

    future.add_done_callback(wake)
    try:
        while not future.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_S):
                    await woken.wait()
            thread = worker()
            if thread is not None and not thread.is_alive() and not future.done():
                raise WorkerThreadLost(f"thread {thread.name} ended with its work unfinished")
    except asyncio.CancelledError:
        future.cancel()  # stops the work only if it has not started, as `asyncio.to_thread` does
        raise
    return future.result()


async def off_loop(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`asyncio.to_thread` for blocking calls that hold no native thread pool (files, processes)."""
    return await _io().run(fn, *args, **kwargs)


@dataclass
class _Job:
    future: Future[Any]
    fn: Callable[[], Any]
    thread: threading.Thread | None = None  # the thread running it, once one does

    def run(self) -> None:
        self.thread = threading.current_thread()
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn()
        except BaseException as exc:
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)


class Workers:
    """Long-lived threads taking work from one queue in the order sent.

    All are started together, when the group is made; none logs (a worker that fails outside its
    work records why in `died` and ends); work sent from one of them runs inline.
    """

    def __init__(self, name: str, size: int = 1) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.died: BaseException | None = None
        names = [name] if size == 1 else [f"{name}-{i}" for i in range(size)]
        self._threads = [threading.Thread(target=self._serve, name=n, daemon=True) for n in names]
        for thread in self._threads:
            thread.start()

    def _serve(self) -> None:
        try:
            while (job := self._jobs.get()) is not None:
                job.run()
                del job
        except BaseException as exc:  # a refused allocation outside the work: recorded, then gone
            self.died = exc

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> _Job:
        context = contextvars.copy_context()
        job = _Job(Future(), lambda: context.run(fn, *args, **kwargs))
        self._jobs.put(job)
        return job

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn` on one of these threads and block until it is done."""
        if threading.current_thread() in self._threads:
            return fn(*args, **kwargs)
        job = self.submit(fn, *args, **kwargs)
        while True:
            try:
                return cast(T, job.future.result(timeout=POLL_S))
            except TimeoutError:
                self._check(job)

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn` on one of these threads, awaited from an event loop."""
        job = self.submit(fn, *args, **kwargs)
        try:
            return cast(T, await settled(job.future, lambda: job.thread))
        except WorkerThreadLost as exc:
            raise WorkerThreadLost(str(exc)) from self.died

    def _check(self, job: _Job) -> None:
        if job.thread is not None and not job.thread.is_alive() and not job.future.done():
            raise WorkerThreadLost(f"thread {job.thread.name} ended with its work unfinished") from self.died

    def alive(self) -> bool:
        return all(thread.is_alive() for thread in self._threads)

    def stop(self) -> None:
        """Let each thread finish the work sent before and end."""
        for _ in self._threads:
            self._jobs.put(None)


def _io() -> Workers:
    with _threads_lock:
        workers = _threads.get(IO)
        if workers is None or not workers.alive():
            workers = _threads[IO] = Workers("reprorl-io", IO_THREADS)
        return workers


def native_thread(name: str) -> Workers:
    """The process's thread for native work of kind `name`, started with its thread team on first
    use (again if it died)."""
    with _threads_lock:
        thread = _threads.get(name)
        if thread is None or not thread.alive():
            thread = _threads[name] = Workers(f"reprorl-{name}")
            thread.call(start_native_team)
        return thread


def start_native_team() -> None:
    """Make this thread's intra-op thread team now, while memory is plentiful, if torch is loaded.

    OpenMP keeps one team per thread that opens a parallel region and makes it at the first one; a
    region over more elements than torch's grain size (32768) opens one.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.ones(1 << 17).add_(1)
