"""The HTTP sampler: token-in/token-out sampling from any OpenAI-compatible server, with bounded retries.

`HttpSampler` sends each request's token ids to `/completions` and reads back the sampled token
ids and their logprobs (vLLM's `return_tokens_as_token_ids`, or `return_token_ids`), so a remote
sample is recorded like a local one. `ChatClient` covers hosted chat-only APIs through
`/chat/completions`, where the server renders the prompt. Both share one transport
(`transport.py`): a pooled `httpx.Client`, explicit timeouts on every call, and bounded
exponential backoff on connection errors, timeouts, 429 and 5xx; anything still failing becomes an
`InferenceError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from reprorl.actions import CLOSE, OPEN, render_call
from reprorl.errors import InferenceError, UserInputError
from reprorl.policy.logprob_probe import LogprobsMode, probe_logprobs
from reprorl.policy.sampling import FinishReason, Sample, SampleRequest
from reprorl.policy.transport import Endpoint, Reply, RetryPolicy, snippet
from reprorl.types import Message, SamplingParams

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
TOKEN_ID_PREFIX = "token_id:"
POLICY_VERSION_HEADER = "x-reprorl-policy-version"

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "POLICY_VERSION_HEADER",
    "TOKEN_ID_PREFIX",
    "ChatClient",
    "ChatReply",
    "HttpSampler",
    "RetryPolicy",
    "chat_message",
    "token_ids_of",
    "tool_call_text",
]


def _first_choice(body: Mapping[str, Any], url: str) -> dict[str, Any]:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise InferenceError(f"{url} answered without choices: {snippet(json.dumps(body))}")
    return choices[0]


def token_ids_of(tokens: object) -> tuple[int, ...]:
    """Token ids from `"token_id:N"` strings; () when any token is not in that form."""
    if not isinstance(tokens, list):
        return ()
    ids: list[int] = []
    for token in tokens:
        if not isinstance(token, str) or not token.startswith(TOKEN_ID_PREFIX):
            return ()
        try:
            ids.append(int(token.removeprefix(TOKEN_ID_PREFIX)))
        except ValueError:
            return ()
    return tuple(ids)


def _sampled_ids(choice: Mapping[str, Any], tokens: object) -> tuple[int, ...]:
    """The sampled ids: vLLM's "token_id:N" logprob tokens, else a `token_ids` list on the choice.

    The second is what `return_token_ids` gives (newer vLLM and SGLang, which has no
    `return_tokens_as_token_ids`).
    """
    ids = token_ids_of(tokens)
    if ids:
        return ids
    listed = choice.get("token_ids")
    if isinstance(listed, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in listed):
        return tuple(listed)
    return ()


def _floats(values: object) -> tuple[float, ...]:
    """Logprobs as floats; () when any is missing (a server that computed none sends nulls)."""
    if not isinstance(values, list):
        return ()
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return ()
    return tuple(float(v) for v in values)


def _finish(choice: Mapping[str, Any], text: str) -> FinishReason:
    reason = choice.get("finish_reason")
    if reason == "length":
        return "length"
    # vLLM names the matched stop string in `stop_reason`, SGLang in `matched_stop`; the text
    # itself ends with it because the request asks for it to be kept.
    matched = choice.get("stop_reason", choice.get("matched_stop"))
    if reason == "tool_calls" or matched == CLOSE or text.endswith(CLOSE):
        return "tool_call"
    return "stop"


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Client:
    """An HTTP client over one endpoint; closes its connections when used as a context manager."""

    _endpoint: Endpoint

    def close(self) -> None:
        self._endpoint.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class HttpSampler(_Client):
    """A `Sampler` backed by an OpenAI-compatible `/completions` endpoint, prompts as token ids."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        policy_version: str = "",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        api_key_env: str | None = None,
        max_concurrency: int = 64,
        stop: Sequence[str] = (CLOSE,),
        skip_special_tokens: bool = True,
    ) -> None:
        if max_concurrency < 1:
            raise UserInputError("max_concurrency must be at least 1", field="max_concurrency")
        self.model = model
        self.policy_version = policy_version
        self.max_concurrency = max_concurrency
        self.stop = list(stop)
        self.skip_special_tokens = skip_special_tokens
        self._endpoint = Endpoint(
            base_url,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            retry=retry or RetryPolicy(),
            api_key_env=api_key_env,
            max_connections=max_concurrency,
        )
        self.logprobs_mode: LogprobsMode | None = None  # set by `probe_logprobs`

    @property
    def base_url(self) -> str:
        return self._endpoint.base_url

    def info(self) -> dict[str, Any]:
        known = {"logprobs": self.logprobs_mode} if self.logprobs_mode is not None else {}
        return {"kind": "http", "base_url": self.base_url, "model": self.model, **known}

    def probe_logprobs(self) -> LogprobsMode:
        """Find out (two one-token requests) whether the server's logprobs are after temperature;
        kept, and recorded by `info`."""
        self.logprobs_mode = probe_logprobs(self._post, self.model)
        return self.logprobs_mode

    def sample(self, requests: Sequence[SampleRequest]) -> list[Sample]:
        """Send every request concurrently; block until all are answered or one has failed."""
        if not requests:
            return []
        keys = [r.key for r in requests]
        if len(set(keys)) != len(keys):
            raise ValueError("sample requests in one batch need distinct keys")
        if len(requests) == 1:
            return [self._one(requests[0])]
        with ThreadPoolExecutor(
            max_workers=min(len(requests), self.max_concurrency), thread_name_prefix="reprorl-http"
        ) as pool:
            futures = [pool.submit(self._one, r) for r in requests]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for future in futures:
                    future.cancel()  # requests not yet sent are dropped; those in flight finish
                raise

    def _body(self, request: SampleRequest) -> dict[str, Any]:
        params = request.params
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(request.prompt_ids),
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": request.seed,
            "n": 1,
            "logprobs": 1,
            "stop": self.stop,
            "include_stop_str_in_output": True,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": self.skip_special_tokens,
        }
        if params.top_k > 0:
            body["top_k"] = params.top_k  # not OpenAI's; vLLM and SGLang read it
        return body

    def _post(self, body: dict[str, Any]) -> Reply:
        return self._endpoint.post("/completions", body)

    def _one(self, request: SampleRequest) -> Sample:
        reply = self._post(self._body(request))
        choice = _first_choice(reply.body, f"{self.base_url}/completions")
        text = choice.get("text")
        text = text if isinstance(text, str) else ""
        logprobs = choice.get("logprobs")
        logprobs = logprobs if isinstance(logprobs, dict) else {}
        return Sample(
            key=request.key,
            token_ids=_sampled_ids(choice, logprobs.get("tokens")),
            logprobs=_floats(logprobs.get("token_logprobs")),
            finish_reason=_finish(choice, text),
            text=text,
            # The server batches as it likes and does not say with what: no batch to replay.
            batch=(),
            policy_version=reply.headers.get(POLICY_VERSION_HEADER) or self.policy_version,
        )


@dataclass(frozen=True)
class ChatReply:
    """One chat completion: its text (tool calls in the `<tool_call>` format) and what came with it."""

    text: str
    token_ids: tuple[int, ...]  # empty unless the server returns tokens as "token_id:N"
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    prompt_tokens: int | None
    completion_tokens: int | None


def chat_message(message: Message) -> dict[str, Any]:
    """A reprorl message as an OpenAI chat message; tool calls travel as `tool_calls`.

    An assistant turn's content carries its calls as `<tool_call>` text; a chat API wants them
    as structured calls, so the text before the first call is sent as content and the calls
    beside it, never both (the model would see every call twice).
    """
    out: dict[str, Any] = {"role": message.role.value, "content": message.content}
    if message.tool_calls:
        out["content"] = message.content.split(OPEN, 1)[0].strip() or None
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def tool_call_text(name: str, arguments: str) -> str:
    """A structured call (arguments as the JSON string an API sends) in the `<tool_call>` text format.

    Arguments that are not a JSON object are kept verbatim, so the action parser reports them as
    the model's parse error instead of this client hiding it.
    """
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return render_call(name, parsed)
    return f'{OPEN}{{"name": {json.dumps(name)}, "arguments": {arguments}}}{CLOSE}'


def _reply_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            arguments = function.get("arguments")
            text += tool_call_text(function["name"], arguments if isinstance(arguments, str) else "{}")
    return text


class ChatClient(_Client):
    """Chat completions from a hosted API; the server renders prompts, so this is not token-in."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        api_key_env: str | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        # Hosted APIs refuse unknown fields; server extensions (e.g. vLLM's
        # return_tokens_as_token_ids) are sent only when asked for here.
        self.extra_body = dict(extra_body or {})
        self._endpoint = Endpoint(
            base_url,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            retry=retry or RetryPolicy(),
            api_key_env=api_key_env,
            max_connections=64,
        )

    @property
    def base_url(self) -> str:
        return self._endpoint.base_url

    def info(self) -> dict[str, Any]:
        return {"kind": "http-chat", "base_url": self.base_url, "model": self.model}

    def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        params: SamplingParams,
        seed: int,
    ) -> ChatReply:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [chat_message(m) for m in messages],
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": seed,
            "n": 1,
            "logprobs": True,
            "top_logprobs": 0,
        }
        if tools:
            body["tools"] = list(tools)
        if params.top_k > 0:
            # A hosted API that knows no top_k refuses the request: better than ignoring it.
            body["top_k"] = params.top_k
        body.update(self.extra_body)
        reply = self._endpoint.post("/chat/completions", body)
        choice = _first_choice(reply.body, f"{self.base_url}/chat/completions")
        message = choice.get("message")
        text = _reply_text(message if isinstance(message, dict) else {})
        logprobs = choice.get("logprobs")
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        entries = [e for e in content if isinstance(e, dict)] if isinstance(content, list) else []
        usage = reply.body.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        return ChatReply(
            text=text,
            token_ids=_sampled_ids(choice, [e.get("token") for e in entries] if entries else None),
            logprobs=_floats([e.get("logprob") for e in entries]) if entries else (),
            finish_reason=_finish(choice, text),
            prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
            completion_tokens=_int_or_none(usage.get("completion_tokens")),
        )
