"""One agent episode's token history behind the agent proxy: each request continued token-in/token-out.

An agent program sends its whole conversation with every request. The proxy never renders the
earlier turns again: it checks that the request starts with exactly what the agent was told so far
(its earlier requests and the replies the proxy gave) and appends only the new messages' tokens
(`ChatRenderer.observation_ids`) to the context the policy sampled in. A request that departs from
that history — the agent dropped, edited or reordered earlier messages, or changed its tools — is
rendered afresh and recorded as diverged, with the index of the first message that differs, so the
agent's own history edits are in the record and no trained token is silently re-tokenised.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from reprorl.hashing import canonical_json, sha256_hex
from reprorl.openai_api.api_errors import ApiError
from reprorl.openai_api.openai_format import request_message
from reprorl.openai_api.schemas import ChatMessageBody
from reprorl.policy.chat import ChatRenderer

Context = Literal["first", "continued", "diverged", "repeated"]


def _arguments(text: object) -> object:
    # The agent may send arguments back re-serialised (other spacing, key order): compare values.
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def normal(message: ChatMessageBody) -> dict[str, Any]:
    """A message as it is compared with the history: what the model could see of it, nothing else."""
    content = message.content
    if isinstance(content, list):
        content = "".join(part.text or "" for part in content)
    calls = [
        {"id": c.id, "name": c.function.name, "arguments": _arguments(c.function.arguments)}
        for c in message.tool_calls or []
    ]
    return {
        "role": message.role.value,
        "content": content or "",
        "tool_calls": calls,
        "tool_call_id": message.tool_call_id,
    }


@dataclass(frozen=True)
class Prompt:
    """The context one request is sampled in, and how it relates to the episode so far."""

    token_ids: tuple[int, ...]  # the whole context
    appended: tuple[int, ...]  # what this request added to the previous context (all of it when rendered)
    context: Context
    diverged_at: int | None = None  # first message index that departs from the history
    request_hash: str = ""


@dataclass
class AgentSession:
    """The history of one rollout's exchanges through the proxy."""

    rollout_id: str
    renderer: ChatRenderer
    history: list[dict[str, Any]] = field(default_factory=list)  # normal messages the agent was told
    tools_hash: str | None = None
    context_ids: list[int] = field(default_factory=list)  # the last prompt plus what was sampled in it
    last_sampled: tuple[int, ...] = ()
    divergences: int = 0
    _told: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def prompt(self, messages: Sequence[ChatMessageBody], tools: Sequence[dict[str, Any]]) -> Prompt:
        """The context to sample this request in (runs where the tokenizer may run: the model thread)."""
        told = [normal(m) for m in messages]
        self._told = told  # `record` extends it with the reply: each message is normalised once
        tools_hash = sha256_hex(canonical_json(list(tools)).encode())
        request_hash = sha256_hex(canonical_json({"messages": told, "tools_hash": tools_hash}).encode())
        if not self.history:
            return self._fresh(messages, tools, "first", None, request_hash)
        at = _first_difference(self.history, told)
        if tools_hash != self.tools_hash:
            at = 0 if at is None else at
        if at is not None:
            self.divergences += 1
            return self._fresh(messages, tools, "diverged", at, request_hash)
        new = messages[len(self.history) :]
        if not new:
            # The same conversation again (a client's retry): sampled again in the same context.
            prompt = tuple(self.context_ids[: len(self.context_ids) - len(self.last_sampled)])
            return Prompt(prompt, (), "repeated", None, request_hash)
        if any(m.role.value == "assistant" for m in new):
            # An assistant turn the policy never sampled: the agent wrote words into the model's mouth.
            self.divergences += 1
            return self._fresh(messages, tools, "diverged", len(self.history), request_hash)
        appended = self.renderer.observation_ids(self.last_sampled, [request_message(m) for m in new])
        return Prompt((*self.context_ids, *appended), tuple(appended), "continued", None, request_hash)

    def _fresh(
        self,
        messages: Sequence[ChatMessageBody],
        tools: Sequence[dict[str, Any]],
        context: Context,
        at: int | None,
        request_hash: str,
    ) -> Prompt:
        try:
            ids = tuple(self.renderer.prompt_ids([request_message(m) for m in messages], list(tools)))
        except ApiError:
            raise
        except Exception as exc:
            raise ApiError(
                400, f"the chat template could not render these messages: {exc}", param="messages"
            ) from None
        return Prompt(ids, ids, context, at, request_hash)

    def record(
        self,
        messages: Sequence[ChatMessageBody],
        tools: Sequence[dict[str, Any]],
        prompt: Prompt,
        sampled: Sequence[int],
        reply: dict[str, Any],
    ) -> None:
        """After a sample: the agent has now been told its request and the proxy's reply."""
        told = self._told if len(self._told) == len(messages) else [normal(m) for m in messages]
        self.history = [*told, normal(ChatMessageBody.model_validate(reply))]
        self.tools_hash = sha256_hex(canonical_json(list(tools)).encode())
        self.context_ids = [*prompt.token_ids, *sampled]
        self.last_sampled = tuple(sampled)


def _first_difference(history: Sequence[dict[str, Any]], told: Sequence[dict[str, Any]]) -> int | None:
    """The first index where the request departs from the history; None when it extends it."""
    for index, known in enumerate(history):
        if index >= len(told) or told[index] != known:
            return index
    return None
