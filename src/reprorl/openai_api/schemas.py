"""The request bodies the policy server accepts: the subset of OpenAI's completions and chat APIs it honours.

Clients send fields this server does not know (OpenAI and vLLM add new ones often), so unknown
fields are ignored; fields whose meaning the server cannot honour (echo) are refused by
`policy_server` with a 400 rather than silently dropped.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from reprorl.openai_api.api_errors import ApiError
from reprorl.types import Role

MAX_SEED = 2**63 - 1
MAX_CHOICES = 16  # `n`: samples of one request
MAX_STOPS, MAX_STOP_CHARS = 4, 64  # OpenAI's limit on `stop`, and a bound on each string


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SamplingBody(Lenient):
    """Fields shared by both endpoints; None means the OpenAI default."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, description="0 or -1 (vLLM's 'off') disable it.")
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    n: int = 1
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False
    skip_special_tokens: bool = True

    def top_count(self) -> int:
        """How many most likely tokens to report per sampled token."""
        return 0

    def include_usage(self) -> bool:
        """A streamed answer ends with a `usage` chunk (`stream_options.include_usage`)."""
        return bool((self.stream_options or {}).get("include_usage"))

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def check_choices(self) -> None:
        """Refuse an `n` or `stop` this API does not honour, naming the field."""
        if not 1 <= self.n <= MAX_CHOICES:
            raise ApiError(400, f"n must be from 1 to {MAX_CHOICES}", param="n")
        stops = self.stop_strings()
        if len(stops) > MAX_STOPS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise ApiError(
                400,
                f"stop takes up to {MAX_STOPS} non-empty strings of at most {MAX_STOP_CHARS} characters",
                param="stop",
            )


class CompletionBody(SamplingBody):
    """`POST /v1/completions`: one prompt, as text or as token ids."""

    prompt: str | list[int]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False

    def top_count(self) -> int:
        return self.logprobs or 0


class ContentPart(Lenient):
    type: str
    text: str | None = None


class FunctionCall(Lenient):
    name: str
    arguments: str = "{}"


class ToolCallBody(Lenient):
    id: str | None = None
    type: str = "function"
    function: FunctionCall


class ChatMessageBody(Lenient):
    role: Role
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallBody] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatBody(SamplingBody):
    """`POST /v1/chat/completions`: a conversation and the tools it may call."""

    messages: list[ChatMessageBody] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def top_count(self) -> int:
        return (self.top_logprobs or 0) if self.logprobs else 0
