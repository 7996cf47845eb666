"""Running verifiers in their own processes, with a time limit, away from the agent's sandbox.

The verifier holds the task's hidden reference; the sandbox never does. Verifiers run in a pool
of worker processes started from a clean interpreter (`forkserver`), so a verifier that hangs or
crashes on a hostile final state costs one pool restart, never the training step.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from reprorl.rewards.base import FinalState, Verifier
from reprorl.types import Task

DEFAULT_TIMEOUT_S = 30.0


def _score(verifier: Verifier, task: Task, state: FinalState) -> dict[str, float]:
    components = verifier.score(task, state)
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

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("forkserver")
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=context)
        return self._pool

    def _restart(self) -> None:
        pool, self._pool = self._pool, None
        self.restarts += 1
        if pool is not None:
            # A hung verifier never returns; its worker must be killed, not waited for.
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
            pool.shutdown(wait=False, cancel_futures=True)

    async def score(
        self, verifier: Verifier, task: Task, state: FinalState
    ) -> tuple[dict[str, float] | None, str | None]:
        """`(components, None)` on success, `(None, why)` when the verifier failed or ran out of time."""
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._executor(), _score, verifier, task, state)
            return await asyncio.wait_for(future, self.timeout_s), None
        except TimeoutError:
            self._restart()
            return None, f"verifier {verifier.name} ran past {self.timeout_s:.0f} s"
        except BrokenProcessPool:
            self._restart()
            return None, f"verifier {verifier.name} crashed its worker process"
        except Exception as exc:  # the verifier's own bug or a hostile state: data, not a crash
            return None, f"verifier {verifier.name} failed: {type(exc).__name__}: {str(exc)[:300]}"

    async def aclose(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await asyncio.get_running_loop().run_in_executor(None, pool.shutdown)

    async def __aenter__(self) -> VerifierRunner:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
