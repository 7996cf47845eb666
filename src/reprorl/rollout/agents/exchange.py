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
from typing import Any, Literal

from reprorl.actions import OPEN, parse_action
from reprorl.hashing import derive_seed
from reprorl.openai_api.agent_session import AgentSession, Prompt, normal
from reprorl.openai_api.api_errors import ApiError
from reprorl.openai_api.openai_format import Reply, chat_message, cut_at_stop, logprob_content, structured
from reprorl.openai_api.schemas import ChatBody, ChatMessageBody
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import Sample, SampleRequest
from reprorl.types import (
    Alternative,
    Role,
    SamplingParams,
    Termination,
    ToolOutcome,
    ToolResult,
    Turn,
    sample_key,
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
    completion_tokens: int = 0  # of the turns, as kept: what the episode's token limit bounds
    sampled_tokens: int = 0  # every row the sampler drew, other choices and text past a stop included
    prompt_tokens: int = 0
    cpu_s: float = 0.0
    requests: int = 0
    refused: int = 0
    termination: Termination | None = None
    over: asyncio.Event = field(default_factory=asyncio.Event)
    answer: str | None = None  # the content of the last reply that called no tool
    _session: AgentSession = field(init=False)
    _choices: _Pending | None = None  # the last request's choices, while the agent may pick another
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
        """Sample one reply to `body` (or `n`) as the next turn and return it as a chat completion."""
        async with self._lock:  # one turn at a time: turns are ordered, and so is the history
            self.requests += 1
            self._admit(body)
            tools = list(body.tools or [])
            self._continue_choice(body.messages)
            prompt = self._session.prompt(body.messages, tools)
            self._attach_results(body.messages)
            index = len(self.turns)
            seed = self.seed_of(index)
            offered = bool(tools) and body.tool_choice != "none"
            # Choice c > 0 draws from a seed derived from the turn's, as serve-policy's `n` does; a
            # lane has one row in a batch at a time, so the choices are sampled one after another.
            seeds = [seed] + [derive_seed(seed, "choice", c) for c in range(1, body.n)]
            choices = []
            for c, choice_seed in enumerate(seeds):
                request = SampleRequest(
                    key=sample_key(self.rollout_id, index, c),
                    prompt_ids=prompt.token_ids,
                    params=self.params,
                    seed=choice_seed,
                    top_logprobs=body.top_count(),  # reported beside the sample; it changes no token
                )
                started = time.perf_counter()
                sample, cpu_s = await self.submit(request)
                choices.append(
                    self._choice(sample, c, choice_seed, body, offered, time.perf_counter() - started)
                )
                self.cpu_s += cpu_s
                self.sampled_tokens += len(sample.token_ids)
            self.prompt_tokens += len(prompt.token_ids)
            first = choices[0]
            self._session.record(body.messages, tools, prompt, first.token_ids, first.message)
            whole = prompt.context != "continued"
            self._choices = _Pending(list(body.messages), tools, prompt, choices)
            self.turns.append(
                _turn(first, choices).model_copy(
                    update={
                        "index": index,
                        "prompt_token_ids": prompt.token_ids if whole else prompt.appended,
                        "context_reset": whole and index > 0,
                        "diverged_at": prompt.diverged_at,
                    }
                )
            )
            self.answer = None if first.reply.tool_calls else (first.reply.content or "")
            self._count()
            if self.completion_tokens >= self.limits.max_tokens:
                self.end(Termination.MAX_TOKENS)
            elif first.reply.tool_calls and len(self.turns) >= self.limits.max_turns:
                self.end(Termination.MAX_TURNS)  # it would call a tool and ask again: no turn is left
            return self._completion(choices, len(prompt.token_ids), with_logprobs=bool(body.logprobs))

    def _choice(
        self, sample: Sample, c: int, seed: int, body: ChatBody, offered: bool, sample_s: float
    ) -> _Choice:
        """One sampled row as the agent sees it: cut at its first stop string, calls parsed out."""
        token_ids, logprobs, text, stop = sample.token_ids, sample.logprobs, sample.text, None
        finish = "length" if sample.finish_reason == "length" else "stop"  # OpenAI's, before calls
        cut = cut_at_stop([self._piece(t) for t in token_ids], body.stop_strings())
        if cut is not None:
            token_ids, logprobs, text, stop, finish = (
                token_ids[: cut.tokens],
                logprobs[: cut.tokens],
                cut.text,
                cut.stop,
                "stop",
            )
        reply = structured(text, finish, stop, tools=offered, seed=seed, choice=c)
        top = sample.top_logprobs[: len(token_ids)]
        message = chat_message(reply)
        return _Choice(
            c, seed, sample, token_ids, logprobs, text, stop, reply, message, top, sample_s, offered
        )

    def _continue_choice(self, messages: Sequence[ChatMessageBody]) -> None:
        """An agent that asked for several choices and sent back another than the first continues
        from that one: the turn becomes it (its tokens are the context now), the first an alternative."""
        pending, self._choices = self._choices, None
        if pending is None or len(pending.choices) < 2 or len(messages) <= len(pending.messages):
            return
        sent = normal(messages[len(pending.messages)])
        if sent == normal(ChatMessageBody.model_validate(pending.choices[0].message)):
            return
        for chosen in pending.choices[1:]:
            if sent == normal(ChatMessageBody.model_validate(chosen.message)):
                self._session.record(
                    pending.messages, pending.tools, pending.prompt, chosen.token_ids, chosen.message
                )
                last = self.turns[-1]
                self.turns[-1] = _turn(chosen, pending.choices).model_copy(
                    update={
                        k: getattr(last, k)
                        for k in ("index", "prompt_token_ids", "context_reset", "diverged_at")
                    }
                )
                self._count()
                return

    def _count(self) -> None:
        # The episode's token budget bounds what it trains on: the rows it continued, as kept.
        self.completion_tokens = sum(len(t.token_ids) for t in self.turns)

    def _admit(self, body: ChatBody) -> None:
        if self.over.is_set():
            self.refused += 1
            reason = self.termination.value if self.termination else "over"
            raise ApiError(409, f"rollout {self.rollout_id} has ended ({reason}); no more turns")
        body.check_choices()
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

    def _piece(self, token: int) -> str:
        return str(self.renderer.tokenizer.decode([token], skip_special_tokens=False))

    def _logprobs(self, choice: _Choice) -> list[dict[str, Any]]:
        top = [tuple((t, self._piece(t), lp) for t, lp in step) for step in choice.top]
        pieces = [self._piece(t) for t in choice.token_ids]
        return logprob_content(choice.token_ids, choice.logprobs, pieces, top, as_ids=False, id_prefix="")

    def _completion(
        self, choices: Sequence[_Choice], prompt_tokens: int, *, with_logprobs: bool
    ) -> dict[str, Any]:
        completion_tokens = sum(len(c.token_ids) for c in choices)
        turn = self.turns[-1]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "policy",
            "system_fingerprint": turn.policy_version,
            "choices": [
                {
                    "index": c.index,
                    "message": c.message,
                    "logprobs": {"content": self._logprobs(c)} if with_logprobs else None,
                    "finish_reason": c.reply.finish_reason,
                    "stop_reason": c.stop,
                }
                for c in choices
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "reprorl": {
                "rollout_id": self.rollout_id,
                "turn": turn.index,
                "policy_version": turn.policy_version,
                "seed": turn.seed,
                **({"seeds": [c.seed for c in choices]} if len(choices) > 1 else {}),
            },
        }


@dataclass(frozen=True)
class _Choice:
    """One of a request's sampled rows, as returned to the agent."""

    index: int
    seed: int
    sample: Sample
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    stop: str | None
    reply: Reply
    message: dict[str, Any]
    top: tuple[tuple[tuple[int, float], ...], ...]
    sample_s: float
    offered: bool  # the request offered tools: a call that does not parse is the model's error

    @property
    def finish(self) -> Literal["stop", "length", "tool_call"]:
        if self.reply.tool_calls:
            return "tool_call"
        return "length" if self.sample.finish_reason == "length" and self.stop is None else "stop"


@dataclass(frozen=True)
class _Pending:
    """The last request with several choices, until the agent's next request says which it took."""

    messages: list[ChatMessageBody]
    tools: list[dict[str, Any]]
    prompt: Prompt
    choices: list[_Choice]


def _turn(chosen: _Choice, choices: Sequence[_Choice]) -> Turn:
    """The turn as the episode continued it: the chosen row, the others as its alternatives."""
    return Turn(
        index=0,
        token_ids=chosen.token_ids,
        logprobs=chosen.logprobs,
        text=chosen.text,
        tool_calls=chosen.reply.tool_calls,
        tool_results=_parse_failures(chosen.text) if chosen.offered and not chosen.reply.tool_calls else (),
        policy_version=chosen.sample.policy_version,
        seed=chosen.seed,
        batch=chosen.sample.batch,
        finish_reason=chosen.finish,
        stop=chosen.stop,
        choice=chosen.index,
        alternatives=tuple(
            Alternative(
                choice=c.index,
                token_ids=c.token_ids,
                logprobs=c.logprobs,
                text=c.text,
                seed=c.seed,
                batch=c.sample.batch,
                stop=c.stop,
                finish_reason=c.finish,
            )
            for c in choices
            if c is not chosen
        ),
        sample_s=sum(c.sample_s for c in choices),
    )


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
