"""An episode driven by an agent program: launched in its sandbox, its model turns served by the proxy.

The env starts as for reprorl's own loop (the task's state built in the sandbox); the agent is
given the task's messages and tool schemas (never its reference) and the proxy's address for this
rollout, and runs until it returns, fails, or the episode ends under it (a turn or token limit the
proxy enforced, or the wall clock), in which case it is killed with everything it started. Then the
episode is scored as any other: the verifier reads the agent's last reply (when it called no tool)
and the files it left. An agent that raises or exits non-zero ends with `agent_error`, scored: it
is the agent's failure, not the platform's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from reprorl.actions import Action
from reprorl.envs.base import ToolEnv
from reprorl.envs.sandbox import SandboxLimits
from reprorl.policy.chat import ChatRenderer
from reprorl.rollout.agents.exchange import Exchange, ExchangeLimits, Submit
from reprorl.rollout.agents.program import AgentProgram
from reprorl.rollout.agents.proxy import MODEL_NAME, AgentProxy
from reprorl.rollout.episode import EpisodeIds, EpisodeLimits, Progress, turn_seed
from reprorl.types import SamplingParams, Task, Termination

BACKSTOP_S = 5.0


@dataclass
class AgentDriver:
    """One episode's agent: what it is, where it reaches the policy, and what it did."""

    program: AgentProgram
    proxy: AgentProxy
    renderer: ChatRenderer
    submit: Submit
    params: SamplingParams
    rollout_id: str
    _info: dict[str, Any] = field(default_factory=dict)

    def info(self) -> dict[str, Any]:
        return {**self.program.info(), **self._info}

    async def drive(
        self,
        env: ToolEnv,
        task: Task,
        ids: EpisodeIds,
        limits: EpisodeLimits,
        progress: Progress,
        sandbox: Any,
    ) -> None:
        observation = await env.start(task, sandbox)
        exchange = Exchange(
            rollout_id=self.rollout_id,
            key=self.proxy.new_key(),
            renderer=self.renderer,
            submit=self.submit,
            params=self.params,
            seed_of=lambda index: turn_seed(ids.seed, index),
            limits=ExchangeLimits(max_turns=limits.max_turns, max_tokens=limits.max_tokens),
        )
        given = {
            "id": task.id,
            "family": task.family,
            "messages": [{"role": m.role.value, "content": m.content} for m in observation.messages],
            "tools": list(observation.tools),
        }
        kwargs = self.program.kwargs(
            base_url=self.proxy.base_url(self.rollout_id), api_key=exchange.key, model=MODEL_NAME, task=given
        )
        self.proxy.open(exchange)
        # The episode's own clock ends it first (max_wall_time); the call's limit is a backstop.
        call = sandbox.call(self.program.fn_ref, kwargs, timeout_s=limits.wall_s + BACKSTOP_S)
        launched = asyncio.ensure_future(call)
        ended = asyncio.ensure_future(exchange.over.wait())
        try:
            await asyncio.wait({launched, ended}, return_when=asyncio.FIRST_COMPLETED)
            report = self._report(launched) if launched.done() else None
        finally:
            for waiting in (launched, ended):
                if not waiting.done():
                    waiting.cancel()  # the sandbox abandons its process; freezing kills all of it
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await waiting
            self.proxy.close(exchange)
            self._record(exchange, progress)
        if exchange.termination is not None:
            progress.termination = exchange.termination
        elif report is not None and not report.get("ok"):
            progress.termination = Termination.AGENT_ERROR
            progress.error = str(report.get("error") or "the agent failed")[:2000]
        else:
            if exchange.answer is not None:
                await env.step(Action(text=exchange.answer))
            progress.termination = Termination.ANSWERED

    def _report(self, launched: asyncio.Future[Any]) -> dict[str, Any]:
        """What the sandbox said of the agent's run; a dead sandbox process is the agent's crash."""
        result = launched.result()
        if not result.ok:
            return {"ok": False, "error": f"{result.error_type}: {result.error}"}
        try:
            report: dict[str, Any] = json.loads(result.value)
        except ValueError:
            return {"ok": False, "error": "the agent's launcher reported nothing readable"}
        self._info.update(
            {k: report[k] for k in ("returned", "exit_code", "stdout", "stderr", "traceback") if k in report}
        )
        return report

    def _record(self, exchange: Exchange, progress: Progress) -> None:
        progress.turns = list(exchange.turns)
        progress.completion_tokens = exchange.completion_tokens
        progress.prompt_tokens = exchange.prompt_tokens
        progress.cpu_s = exchange.cpu_s
        self._info.update(
            {
                "requests": exchange.requests,
                "refused": exchange.refused,
                "divergences": exchange.divergences,
                "sampled_tokens": exchange.sampled_tokens,
            }
        )


def agent_limits(base: SandboxLimits | None, program: AgentProgram) -> SandboxLimits:
    """The sandbox limits of an agent episode: the run's, with the agent's CPU and memory allowance."""
    return (base or SandboxLimits()).model_copy(
        update={"cpu_s": program.spec.cpu_s, "memory_bytes": program.spec.memory_bytes}
    )
