"""One rollout's exchanges with its agent: each request sampled from the policy and recorded as a turn.

The agent sends its whole conversation with every request; `AgentSession` decides the context the
policy samples in (the recorded history continued token-in/token-out, or rendered afresh where the
agent edited it, which the turn records as `context_reset` with `diverged_at`). The reply is the
policy's tokens exactly as sampled, its tool calls parsed into OpenAI's `tool_calls`; the results
the agent sends back for them on its next request become that turn's tool results. The episode's
limits are the run's: the turn after the last allowed one, and any request once the episode is
over, are refused, and `over` tells the driver to stop the agent.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reprorl.actions import OPEN, parse_action
from reprorl.openai_api.agent_session import AgentSession
from reprorl.openai_api.api_errors import ApiError
from reprorl.openai_api.openai_format import chat_message, logprob_content, structured
from reprorl.openai_api.schemas import ChatBody, ChatMessageBody
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import Sample, SampleRequest
from reprorl.types import (
    Role,
    SamplingParams,
    Termination,
    ToolOutcome,
    ToolResult,
    Turn,
)

Submit = Callable[[SampleRequest], Awaitable[tuple[Sample, float]]]
SeedOf = Callable[[int], int]  # a turn's sampling seed from its index


@dataclass(frozen=True)
class ExchangeLimits:
    """The run's episode limits, as the proxy enforces them on an agent's requests."""

    max_turns: int
    max_tokens: int


@dataclass
class Exchange:
    """The proxy side of one agent episode."""

    rollout_id: str
    key: str
    renderer: ChatRenderer
    submit: Submit
    params: SamplingParams
    seed_of: SeedOf
    limits: ExchangeLimits
    turns: list[Turn] = field(default_factory=list)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cpu_s: float = 0.0
    requests: int = 0
    refused: int = 0
    termination: Termination | None = None
    over: asyncio.Event = field(default_factory=asyncio.Event)
    answer: str | None = None  # the content of the last reply that called no tool
    _session: AgentSession = field(init=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self._session = AgentSession(self.rollout_id, self.renderer)

    @property
    def divergences(self) -> int:
        return self._session.divergences

    def end(self, termination: Termination) -> None:
        """The episode is over (a limit, or the driver's wall clock); later requests are refused."""
        if self.termination is None:
            self.termination = termination
        self.over.set()

    async def chat(self, body: ChatBody) -> dict[str, Any]:
        """Sample one reply to `body` as the next turn and return it as a chat completion."""
        async with self._lock:  # one turn at a time: turns are ordered, and so is the history
            self.requests += 1
            self._admit(body)
            tools = list(body.tools or [])
            prompt = self._session.prompt(body.messages, tools)
            self._attach_results(body.messages)
            index = len(self.turns)
            seed = self.seed_of(index)
            request = SampleRequest(
                key=f"{self.rollout_id}/{index}",
                prompt_ids=prompt.token_ids,
                params=self.params,
                seed=seed,
                top_logprobs=body.top_count(),  # reported beside the sample; it changes no token
            )
            started = time.perf_counter()
            sample, cpu_s = await self.submit(request)
            sample_s = time.perf_counter() - started
            offered = bool(tools) and body.tool_choice != "none"
            finish = "length" if sample.finish_reason == "length" else "stop"  # OpenAI's, before calls
            reply = structured(sample.text, finish, None, tools=offered, seed=seed, choice=0)
            message = chat_message(reply)
            self._session.record(body.messages, tools, prompt, sample.token_ids, message)
            whole = prompt.context != "continued"
            self.turns.append(
                Turn(
                    index=index,
                    prompt_token_ids=prompt.token_ids if whole else prompt.appended,
                    context_reset=whole and index > 0,
                    diverged_at=prompt.diverged_at,
                    token_ids=sample.token_ids,
                    logprobs=sample.logprobs,
                    text=sample.text,
                    tool_calls=reply.tool_calls,
                    tool_results=_parse_failures(sample.text) if offered and not reply.tool_calls else (),
                    policy_version=sample.policy_version,
                    seed=seed,
                    batch=sample.batch,
                    finish_reason="tool_call"
                    if reply.tool_calls
                    else ("length" if sample.finish_reason == "length" else "stop"),
                    sample_s=sample_s,
                )
            )
            self.completion_tokens += len(sample.token_ids)
            self.prompt_tokens += len(request.prompt_ids)
            self.cpu_s += cpu_s
            self.answer = None if reply.tool_calls else (reply.content or "")
            if self.completion_tokens >= self.limits.max_tokens:
                self.end(Termination.MAX_TOKENS)
            elif reply.tool_calls and len(self.turns) >= self.limits.max_turns:
                self.end(Termination.MAX_TURNS)  # it would call a tool and ask again: no turn is left
            logprobs = {"content": self._logprobs(sample)} if body.logprobs else None
            return self._completion(message, reply.finish_reason, sample, len(request.prompt_ids), logprobs)

    def _admit(self, body: ChatBody) -> None:
        if self.over.is_set():
            self.refused += 1
            reason = self.termination.value if self.termination else "over"
            raise ApiError(409, f"rollout {self.rollout_id} has ended ({reason}); no more turns")
        if body.n != 1:
            raise ApiError(400, "an episode samples one reply per request; send n=1", param="n")
        if len(self.turns) >= self.limits.max_turns:
            self.refused += 1
            self.end(Termination.MAX_TURNS)
            raise ApiError(409, f"rollout {self.rollout_id} has used its {self.limits.max_turns} turns")

    def _attach_results(self, messages: Sequence[ChatMessageBody]) -> None:
        """The tool messages after the last reply are the results of its calls: record them on it."""
        if not self.turns or not self.turns[-1].tool_calls:
            return
        last = self.turns[-1]
        names = {call.id: call.name for call in last.tool_calls}
        results = list(last.tool_results)
        for message in _after_last_assistant(messages):
            if message.role is not Role.TOOL or message.tool_call_id not in names:
                continue
            content = message.content if isinstance(message.content, str) else ""
            if isinstance(message.content, list):
                content = "".join(part.text or "" for part in message.content)
            results.append(
                ToolResult(
                    call_id=message.tool_call_id or "",
                    name=names[message.tool_call_id or ""],
                    outcome=ToolOutcome.OK,
                    content=content or "",
                )
            )
        self.turns[-1] = last.model_copy(update={"tool_results": tuple(results)})

    def _logprobs(self, sample: Sample) -> list[dict[str, Any]]:
        decode = self.renderer.tokenizer.decode

        def text(token: int) -> str:
            return str(decode([token], skip_special_tokens=False))

        top = [tuple((t, text(t), lp) for t, lp in step) for step in sample.top_logprobs]
        pieces = [text(t) for t in sample.token_ids]
        return logprob_content(sample.token_ids, sample.logprobs, pieces, top, as_ids=False, id_prefix="")

    def _completion(
        self,
        message: dict[str, Any],
        finish: str,
        sample: Sample,
        prompt_tokens: int,
        logprobs: dict[str, Any] | None,
    ) -> dict[str, Any]:
        completion_tokens = len(sample.token_ids)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "policy",
            "system_fingerprint": sample.policy_version,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "reprorl": {
                "rollout_id": self.rollout_id,
                "turn": len(self.turns) - 1,
                "policy_version": sample.policy_version,
                "seed": self.turns[-1].seed,
            },
        }


def _after_last_assistant(messages: Sequence[ChatMessageBody]) -> Sequence[ChatMessageBody]:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role is Role.ASSISTANT:
            return messages[index + 1 :]
    return ()


def _parse_failures(text: str) -> tuple[ToolResult, ...]:
    """A reply that tried to call a tool and failed to parse is the model's error, classified."""
    if OPEN not in text:
        return ()
    action = parse_action(text)
    return tuple(
        ToolResult(call_id=f"parse.{i}", name="", outcome=ToolOutcome.PARSE_ERROR, error=error)
        for i, error in enumerate(action.parse_errors)
    )
