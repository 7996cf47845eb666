"""Noise injection: deliberate latency, timeouts, transient errors, stale reads and truncation.

Production tools are slow, flaky and sometimes wrong; an agent trained only on perfect tools
learns nothing about recovering. Every call draws the same number of random values from the
episode's own seeded generator, so the noise an episode sees depends only on its seed and its
sequence of calls, never on timing. Results shaped by noise say so in `ToolResult.noise`.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass
from statistics import NormalDist

from reprorl.config.spec import NoiseSpec
from reprorl.envs.calls import CallOutcome
from reprorl.envs.tool import Tool
from reprorl.types import Permission, ToolOutcome, ToolResult


@dataclass(frozen=True)
class _Draw:
    jitter: float
    timeout: float
    transient: float
    stale: float
    truncate: float
    cut: float


class NoiseInjector:
    """Applies a `NoiseSpec` to one episode's tool calls."""

    def __init__(self, spec: NoiseSpec, seed: int) -> None:
        self.spec = spec
        self.rng = random.Random(seed)
        self._draw: _Draw | None = None

    async def before_call(self, tool: Tool) -> ToolResult | None:
        """Delay the call; return an injected failure instead of running it, or None to run it."""
        if not self.spec.active:
            return None
        r = self.rng.random
        draw = self._draw = _Draw(r(), r(), r(), r(), r(), r())
        latency = self.spec.latency_s
        if self.spec.latency_sigma > 0:
            # One more draw only when asked for, so the existing settings see the same values.
            z = NormalDist().inv_cdf(min(max(r(), 1e-12), 1 - 1e-12))
            latency *= math.exp(self.spec.latency_sigma * z)
        delay = latency + draw.jitter * self.spec.jitter_s
        if delay > 0:
            await asyncio.sleep(delay)
        if draw.timeout < self.spec.timeout_p:
            return _injected(
                ToolOutcome.TOOL_TIMEOUT, "the tool did not answer in time (injected)", "timeout"
            )
        if draw.transient < self.spec.transient_error_p:
            return _injected(ToolOutcome.INFRA_ERROR, "temporary failure, try again (injected)", "transient")
        return None

    def stale(self, tool: Tool) -> bool:
        """Whether this read-only call is served from the episode's start state."""
        return (
            self._draw is not None
            and tool.permission == Permission.READ
            and self._draw.stale < self.spec.stale_p
        )

    def after_call(self, outcome: CallOutcome, *, stale: bool) -> CallOutcome:
        result = outcome.result
        if stale:
            result = result.model_copy(update={"noise": "stale"})
        draw = self._draw
        if draw is not None and result.outcome == ToolOutcome.OK and draw.truncate < self.spec.truncate_p:
            keep = int(len(result.content) * draw.cut)
            result = result.model_copy(
                update={
                    "outcome": ToolOutcome.OUTPUT_TRUNCATED,
                    "content": result.content[:keep],
                    "original_chars": len(result.content),
                    "noise": "truncate",
                }
            )
        return CallOutcome(result, outcome.terminates)


def _injected(outcome: ToolOutcome, detail: str, kind: str) -> ToolResult:
    return ToolResult(call_id="", name="", outcome=outcome, error=detail, noise=kind)
