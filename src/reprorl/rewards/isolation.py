"""Running verifiers in their own processes, with a time limit, away from the agent's sandbox.

The verifier holds the task's hidden reference; the sandbox never does. Each verifier call runs in
a worker process of its own interpreter (`rewards/worker.py`), one call per worker at a time, so the
time limit counts the verifier's own run time and a verifier that hangs or crashes on a hostile final
state costs that one worker, never another call nor the training step.

A failure comes back classified (`ScoreError`): the verifier ran out of time, crashed its worker, or
raised. A `StateAccessError` (the verifier was pointed through a link or at a FIFO or device the
agent left) is the agent's doing, `agent_state`, and the episode scores it 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from reprorl.rewards.base import FinalState, Verifier
from reprorl.rewards.wire import HEADER, LOADED, MAX_MESSAGE_BYTES
from reprorl.types import ScoreFailure, Task

DEFAULT_TIMEOUT_S = 30.0
# Starting an interpreter and unpickling a verifier (which may import its family's module) is not the
# verifier's run time: it gets its own, generous bound.
LOAD_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ScoreError:
    """Why a verifier gave no components: its class and one line saying what happened."""

    kind: ScoreFailure
    message: str

    def __str__(self) -> str:
        return self.message


class _WorkerDied(Exception):
    """The worker's pipe closed mid-call: the process crashed or was killed."""


class _Worker:
    """One worker process and its two pipes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls) -> _Worker:
        package_parent = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "reprorl.rewards.worker",
            str(os.getpid()),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        worker = cls(process)
        # The launcher's import path, so a verifier pickled by reference (a plug-in module) imports there.
        try:
            await worker._send(pickle.dumps([entry for entry in sys.path if entry]))
        except (BrokenPipeError, ConnectionResetError) as exc:
            # Killed as it started (a whole pool killed at once takes a starting worker too).
            await worker.reap()
            raise _WorkerDied("its process ended as it started") from exc
        return worker

    async def _send(self, payload: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(HEADER.pack(len(payload)) + payload)
        await self.process.stdin.drain()

    async def _receive(self) -> bytes:
        assert self.process.stdout is not None
        try:
            (size,) = HEADER.unpack(await self.process.stdout.readexactly(HEADER.size))
            if size > MAX_MESSAGE_BYTES:
                raise _WorkerDied(f"sent a {size}-byte reply")
            return await self.process.stdout.readexactly(size)
        except asyncio.IncompleteReadError as exc:
            raise _WorkerDied("its process ended") from exc

    async def call(self, payload: bytes, timeout_s: float) -> tuple[str, Any]:
        """Send one request; `TimeoutError` when the verifier itself runs past `timeout_s`."""
        try:
            await self._send(payload)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise _WorkerDied("its process ended") from exc
        if await asyncio.wait_for(self._receive(), LOAD_TIMEOUT_S) != LOADED:
            raise _WorkerDied("broke the protocol")
        kind, value = pickle.loads(await asyncio.wait_for(self._receive(), timeout_s))
        return str(kind), value

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    async def stop(self) -> None:
        """Close the request pipe (the worker exits at its end) and reap the process."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            await self.reap()

    async def reap(self) -> None:
        """Kill the process and wait a bounded time for its exit to be seen: the exit of a killed
        process can be lost (the thread that waits for it refused by a full address space), and a
        pool must not wait for ever on one."""
        self.kill()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.process.wait(), STOP_TIMEOUT_S)


class VerifierRunner:
    """Scores final states in worker processes; failures come back as data, not exceptions."""

    def __init__(self, workers: int = 2, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.workers = workers
        self.timeout_s = timeout_s
        self.restarts = 0  # workers killed or lost to a hung or crashed verifier
        self._slots = asyncio.Semaphore(workers)
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()

    async def score(
        self, verifier: Verifier, task: Task, state: FinalState
    ) -> tuple[dict[str, float] | None, ScoreError | None]:
        """`(components, None)` on success; `(None, error)` when the verifier failed or ran out of time;
        `({name: 0.0}, error)` with kind `agent_state` when the agent's final state broke it."""
        name = verifier.name
        try:
            payload = cloudpickle.dumps((verifier, task, state))
        except Exception as exc:
            return None, ScoreError(
                ScoreFailure.VERIFIER_ERROR, f"verifier {name} cannot be sent to a worker: {exc}"[:400]
            )
        async with self._slots:
            # A worker can die of something outside the verifier (a kill, the OOM killer, an idle
            # worker lost meanwhile): the call goes once more to a fresh one. A verifier that kills
            # its worker does so again, and only then is the crash its own. Scoring is a pure
            # function of the frozen state, so a second call cannot score differently.
            for attempt in range(2):
                # The second try gets a new worker: whatever killed the first (a whole pool killed
                # at once) may have taken the idle ones too.
                try:
                    worker = self._idle.pop() if self._idle and attempt == 0 else await _Worker.start()
                except _WorkerDied as exc:
                    self.restarts += 1
                    if attempt == 0:
                        continue
                    return None, ScoreError(
                        ScoreFailure.VERIFIER_CRASH,
                        f"no verifier worker for {name} could start: {exc}",
                    )
                self._busy.add(worker)
                try:
                    kind, value = await worker.call(payload, self.timeout_s)
                except TimeoutError:
                    self._lose(worker)
                    return None, ScoreError(
                        ScoreFailure.VERIFIER_TIMEOUT, f"verifier {name} ran past {self.timeout_s:g} s"
                    )
                except _WorkerDied as exc:
                    self._lose(worker)
                    if attempt == 0:
                        continue
                    return None, ScoreError(
                        ScoreFailure.VERIFIER_CRASH,
                        f"verifier {name} crashed its worker process, twice: {exc}",
                    )
                except BaseException:
                    self._lose(worker)  # cancelled mid-call: what the worker is doing is unknown
                    raise
                self._busy.discard(worker)
                self._idle.append(worker)
                break
        if kind == "agent":
            return {name: 0.0}, ScoreError(
                ScoreFailure.AGENT_STATE, f"the final state refused {name}: {value}"
            )
        if kind == "error":
            return None, ScoreError(ScoreFailure.VERIFIER_ERROR, f"verifier {name} failed: {value}")
        return dict(value), None

    def _lose(self, worker: _Worker) -> None:
        self._busy.discard(worker)
        self.restarts += 1
        worker.kill()
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().create_task(worker.reap())

    async def aclose(self) -> None:
        workers = [*self._idle, *self._busy]
        self._idle.clear()
        for worker in self._busy:
            worker.kill()
        self._busy.clear()
        await asyncio.gather(*(worker.stop() for worker in workers), return_exceptions=True)

    async def __aenter__(self) -> VerifierRunner:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
