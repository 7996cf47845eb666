"""Running verifiers in their own processes, with a time limit, away from the agent's sandbox.

The verifier holds the task's hidden reference; the sandbox never does. Verifiers run in a pool
of worker processes started from a clean interpreter (`forkserver`), so a verifier that hangs or
crashes on a hostile final state costs one pool restart, never the training step.

A failure comes back classified (`ScoreError`): the verifier ran out of time, crashed its worker, or
raised. A `StateAccessError` (the verifier was pointed through a link or at a FIFO or device the
agent left) is the agent's doing, `agent_state`, and the episode scores it 0. A call whose worker was
killed because *another* call hung is not that call's failure: it is run again on the new pool.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from reprorl.rewards.base import FinalState, StateAccessError, Verifier
from reprorl.types import ScoreFailure, Task

DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ScoreError:
    """Why a verifier gave no components: its class and one line saying what happened."""

    kind: ScoreFailure
    message: str

    def __str__(self) -> str:
        return self.message


def _score(verifier: Verifier, task: Task, state: FinalState) -> dict[str, float] | str:
    try:
        components = verifier.score(task, state)
    except StateAccessError as exc:  # the agent's planted state, told apart from the verifier's bugs
        return str(exc)[:300]
    clean: dict[str, float] = {}
    for name, value in components.items():
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"component {name!r} is {number}")
        clean[str(name)] = number
    return clean


class VerifierRunner:
    """Scores final states in worker processes; failures come back as data, not exceptions."""

    def __init__(self, workers: int = 2, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.workers = workers
        self.timeout_s = timeout_s
        self.restarts = 0
        self._pool: ProcessPoolExecutor | None = None
        self._slots = asyncio.Semaphore(workers)
        self._generation = 0  # pools started so far; a call on an older one was killed for another's sake

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("forkserver")
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=context)
        return self._pool

    def _restart(self) -> None:
        pool, self._pool = self._pool, None
        self.restarts += 1
        self._generation += 1
        if pool is not None:
            # A hung verifier never returns; its worker must be killed, not waited for.
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
            pool.shutdown(wait=False, cancel_futures=True)

    async def score(
        self, verifier: Verifier, task: Task, state: FinalState
    ) -> tuple[dict[str, float] | None, ScoreError | None]:
        """`(components, None)` on success; `(None, error)` when the verifier failed or ran out of time;
        `({name: 0.0}, error)` with kind `agent_state` when the agent's final state broke it."""
        loop = asyncio.get_running_loop()
        name = verifier.name
        for _ in range(3):
            generation = self._generation
            try:
                # One call per worker at a time, so the time limit counts the verifier's own time and
                # never a wait behind other calls in the pool's queue.
                async with self._slots:
                    future = loop.run_in_executor(self._executor(), _score, verifier, task, state)
                    outcome = await asyncio.wait_for(future, self.timeout_s)
            except TimeoutError:
                self._restart()
                return None, ScoreError(
                    ScoreFailure.VERIFIER_TIMEOUT, f"verifier {name} ran past {self.timeout_s:g} s"
                )
            except asyncio.CancelledError:
                task_ = asyncio.current_task()
                if generation != self._generation and task_ is not None and not task_.cancelling():
                    continue  # still queued when another call's restart cancelled the pool's queue
                raise
            except BrokenProcessPool:
                if generation != self._generation:
                    continue  # killed with a pool restarted for another call's sake: not this one's failure
                self._restart()
                return None, ScoreError(
                    ScoreFailure.VERIFIER_CRASH, f"verifier {name} crashed its worker process"
                )
            except Exception as exc:  # the verifier's own bug or a hostile state: data, not a crash
                message = f"verifier {name} failed: {type(exc).__name__}: {str(exc)[:300]}"
                return None, ScoreError(ScoreFailure.VERIFIER_ERROR, message)
            if isinstance(outcome, str):
                return {name: 0.0}, ScoreError(
                    ScoreFailure.AGENT_STATE, f"the final state refused {name}: {outcome}"
                )
            return outcome, None
        return None, ScoreError(
            ScoreFailure.VERIFIER_CRASH, f"verifier {name}: its pool kept being restarted"
        )

    async def aclose(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await asyncio.get_running_loop().run_in_executor(None, pool.shutdown)

    async def __aenter__(self) -> VerifierRunner:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
