"""The policy server: an OpenAI-compatible HTTP front for one `LocalSampler`, concurrent requests batched.

It serves the subset of the OpenAI API that token-in/token-out sampling needs: `/v1/completions`
with the prompt as text or token ids (sampled tokens come back as `"token_id:N"`, vLLM's
convention), `/v1/chat/completions` rendered with the model's chat template, `/v1/models`, and
`/health` with the batcher's counters. Chat replies carry the model's tool calls as OpenAI's
`tool_calls` (`reprorl.openai_api.openai_format`); `n` samples of one request share a batch, each from
its own derived seed; `stop` strings cut the reply where one first occurs; `top_logprobs` come from
the distribution each token was drawn from. Every response carries the served policy version in
the `x-reprorl-policy-version` header and as `system_fingerprint`. Bad input is a 400 with an OpenAI
error object; nothing a client sends can produce a traceback.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

from reprorl.actions import CLOSE
from reprorl.hashing import derive_seed
from reprorl.openai_api.api_errors import DEFAULT_MAX_BODY_BYTES, ApiError, install_error_handlers
from reprorl.openai_api.openai_format import (
    chat_message,
    cut_at_stop,
    logprob_content,
    request_message,
    structured,
)
from reprorl.openai_api.responses_api import ResponsesBody, as_chat, as_response
from reprorl.openai_api.schemas import ChatBody, CompletionBody, SamplingBody
from reprorl.openai_api.streaming import chat_chunks, completion_chunks, sse
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.http import POLICY_VERSION_HEADER, TOKEN_ID_PREFIX
from reprorl.policy.sampling import LocalSampler, Sample, SampleRequest
from reprorl.serve.batcher import MicroBatcher
from reprorl.types import SamplingParams

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /completions
CHAT_MAX_TOKENS = 256  # SamplingParams' default


def _openai_finish(sample: Sample) -> tuple[str, str | int | None]:
    """OpenAI's finish_reason plus vLLM's stop_reason (the stop string or token that ended the row)."""
    if sample.finish_reason == "length":
        return "length", None
    if sample.finish_reason == "tool_call":
        return "stop", CLOSE
    return "stop", sample.token_ids[-1] if sample.token_ids else None


@dataclass(frozen=True)
class Choice:
    """One of a request's samples as it is answered: cut at a stop string where one matched."""

    sample: Sample
    seed: int
    text: str
    pieces: list[str]  # each kept token's own text
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish: str
    stop_reason: str | int | None
    # Per token: (id, text, logprob) of the most likely ones, most likely first.
    top: tuple[tuple[tuple[int, str, float], ...], ...] = ()


class PolicyServer:
    """The state behind the endpoints: the sampler, its renderer and batcher, and a request counter."""

    def __init__(
        self,
        sampler: LocalSampler,
        renderer: ChatRenderer,
        *,
        model_name: str,
        seed: int,
        window_s: float,
        max_batch: int,
    ) -> None:
        self.sampler = sampler
        self.renderer = renderer
        self.model_name = model_name
        self.seed = seed
        self.batcher = MicroBatcher(sampler, window_s=window_s, max_batch=max_batch)
        self.vocab_size = len(renderer.tokenizer)
        self.created = int(time.time())
        self._requests = itertools.count()

    def check(self, body: SamplingBody) -> None:
        """Refuse what this server cannot honour instead of silently doing something else."""
        if body.model is not None and body.model != self.model_name:
            raise ApiError(
                404, f"model {body.model!r} is not served here; this server serves {self.model_name!r}"
            )
        body.check_choices()

    async def sample_choices(
        self, prompt_ids: Sequence[int], body: SamplingBody, max_tokens: int
    ) -> list[Choice]:
        """The request's `n` samples, queued together so they share a batch, each cut at `stop`."""
        if body.n == 1:
            samples = [await self.sample(prompt_ids, body, max_tokens)]
        else:
            # Choice i > 0 draws from a seed derived from the request's, so `n` is as reproducible as 1.
            base = (
                body.seed
                if body.seed is not None
                else derive_seed(self.seed, "request", next(self._requests))
            )
            seeds = [base] + [derive_seed(base, "choice", i) for i in range(1, body.n)]
            samples = list(
                await asyncio.gather(
                    *(self.sample(prompt_ids, body.model_copy(update={"seed": s}), max_tokens) for s in seeds)
                )
            )
        return [await self.batcher.run(self.choice, s, seed, body) for s, seed in samples]

    def choice(self, sample: Sample, seed: int, body: SamplingBody) -> Choice:
        """One sample as a choice: its text and tokens, cut at the first stop string (model thread)."""
        token_ids, logprobs = sample.token_ids, sample.logprobs
        text, pieces = self.pieces(token_ids, body.skip_special_tokens)
        finish, stop_reason = _openai_finish(sample)
        cut = cut_at_stop(pieces, body.stop_strings())
        if cut is not None:
            token_ids, logprobs, pieces = (
                token_ids[: cut.tokens],
                logprobs[: cut.tokens],
                pieces[: cut.tokens],
            )
            text, _ = self.pieces(token_ids, body.skip_special_tokens)
            text = text[: text.find(cut.stop)] if cut.stop in text else cut.text
            finish, stop_reason = "stop", cut.stop
        decode = self.renderer.tokenizer.decode
        top = tuple(
            tuple((t, str(decode([t], skip_special_tokens=False)), lp) for t, lp in step)
            for step in sample.top_logprobs[: len(token_ids)]
        )
        return Choice(sample, seed, text, pieces, tuple(token_ids), tuple(logprobs), finish, stop_reason, top)

    async def sample(
        self, prompt_ids: Sequence[int], body: SamplingBody, max_tokens: int
    ) -> tuple[Sample, int]:
        """Validate the prompt, queue it for the next batch, and return its sample and seed."""
        if not prompt_ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        bad = [t for t in prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ApiError(
                400, f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})", param="prompt"
            )
        if len(prompt_ids) >= self.sampler.max_positions:
            raise ApiError(
                400,
                f"the prompt has {len(prompt_ids)} tokens; the context is {self.sampler.max_positions}",
                param="prompt",
            )
        number = next(self._requests)
        # Without a seed a request still gets a distinct, reproducible one, reported back to it.
        seed = body.seed if body.seed is not None else derive_seed(self.seed, "request", number)
        top_k = body.top_k if body.top_k is not None and body.top_k > 0 else 0
        params = SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=top_k,
            max_tokens=max_tokens,
            seed=seed,
        )
        request = SampleRequest(
            key=f"req-{number}",
            prompt_ids=tuple(prompt_ids),
            params=params,
            seed=seed,
            top_logprobs=body.top_count(),
        )
        return await self.batcher.submit(request), seed

    def pieces(self, token_ids: Sequence[int], skip_special_tokens: bool) -> tuple[str, list[str]]:
        """The sample's text and each token's own text (runs on the model thread: it tokenizes)."""
        tokenizer = self.renderer.tokenizer
        text = tokenizer.decode(
            list(token_ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )
        pieces = [
            tokenizer.decode([t], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            for t in token_ids
        ]
        return str(text), [str(p) for p in pieces]

    def envelope(self, kind: str, choices: Sequence[Choice], prompt_tokens: int) -> dict[str, Any]:
        first = choices[0]
        completion_tokens = sum(len(c.token_ids) for c in choices)
        return {
            "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "system_fingerprint": first.sample.policy_version,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            # What a caller needs to record or replay this sample: seed and the batch it was in.
            "reprorl": {
                "policy_version": first.sample.policy_version,
                "seed": first.seed,
                "key": first.sample.key,
                "batch": list(first.sample.batch),
                **({"seeds": [c.seed for c in choices]} if len(choices) > 1 else {}),
            },
        }

    @staticmethod
    def add_token_ids(
        choice: dict[str, Any], body: SamplingBody, prompt_ids: Sequence[int], got: Choice
    ) -> None:
        """`return_token_ids` (vLLM and SGLang): the prompt's and the sample's ids on the choice."""
        if body.return_token_ids:
            choice["prompt_token_ids"] = list(prompt_ids)
            choice["token_ids"] = list(got.token_ids)

    async def completions(self, body: CompletionBody) -> dict[str, Any]:
        self.check(body)
        if body.echo:
            raise ApiError(400, "echo is not supported", param="echo")
        if isinstance(body.prompt, str):
            prompt_ids = await self.batcher.run(self.renderer.encode, body.prompt)
        else:
            prompt_ids = list(body.prompt)
        got = await self.sample_choices(prompt_ids, body, body.max_tokens or COMPLETION_MAX_TOKENS)
        choices = []
        for index, c in enumerate(got):
            logprobs = None
            if body.logprobs is not None:
                as_ids = body.return_tokens_as_token_ids
                logprobs = {
                    "tokens": [f"{TOKEN_ID_PREFIX}{t}" for t in c.token_ids] if as_ids else list(c.pieces),
                    "token_logprobs": list(c.logprobs),
                    "top_logprobs": [
                        {(f"{TOKEN_ID_PREFIX}{t}" if as_ids else text): lp for t, text, lp in step}
                        for step in c.top
                    ]
                    if c.top
                    else None,
                }
            choice = {
                "index": index,
                "text": c.text,
                "logprobs": logprobs,
                "finish_reason": c.finish,
                "stop_reason": c.stop_reason,
            }
            self.add_token_ids(choice, body, prompt_ids, c)
            choices.append(choice)
        return {**self.envelope("text_completion", got, len(prompt_ids)), "choices": choices}

    async def chat(self, body: ChatBody) -> dict[str, Any]:
        self.check(body)
        messages = [request_message(m) for m in body.messages]
        tools = body.tools or []
        try:
            prompt_ids = await self.batcher.run(self.renderer.prompt_ids, messages, tools)
        except Exception as exc:
            raise ApiError(
                400, f"the chat template could not render these messages: {exc}", param="messages"
            ) from None
        max_tokens = body.max_completion_tokens or body.max_tokens or CHAT_MAX_TOKENS
        got = await self.sample_choices(prompt_ids, body, max_tokens)
        offered = bool(tools) and body.tool_choice != "none"
        choices = []
        for index, c in enumerate(got):
            logprobs = None
            if body.logprobs:
                content = logprob_content(
                    c.token_ids,
                    c.logprobs,
                    c.pieces,
                    c.top,
                    as_ids=body.return_tokens_as_token_ids,
                    id_prefix=TOKEN_ID_PREFIX,
                )
                logprobs = {"content": content}
            reply = structured(c.text, c.finish, c.stop_reason, tools=offered, seed=c.seed, choice=index)
            choice = {
                "index": index,
                "message": chat_message(reply),
                "logprobs": logprobs,
                "finish_reason": reply.finish_reason,
                "stop_reason": reply.stop_reason,
            }
            self.add_token_ids(choice, body, prompt_ids, c)
            choices.append(choice)
        return {**self.envelope("chat.completion", got, len(prompt_ids)), "choices": choices}

    def models(self) -> dict[str, Any]:
        entry = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "reprorl",
            "root": self.model_name,
            "max_model_len": self.sampler.max_positions,
            "policy_version": self.sampler.policy_version,
        }
        return {"object": "list", "data": [entry]}

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "model": self.model_name,
            "policy_version": self.sampler.policy_version,
            "sampler": self.sampler.info(),
            **self.batcher.stats.as_dict(),
        }


def create_app(
    sampler: LocalSampler,
    renderer: ChatRenderer,
    *,
    model_name: str,
    seed: int = 0,
    window_s: float = 0.005,
    max_batch: int = 32,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The FastAPI app serving `sampler`; run it with uvicorn (`reprorl serve policy` does)."""
    server = PolicyServer(
        sampler, renderer, model_name=model_name, seed=seed, window_s=window_s, max_batch=max_batch
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await server.batcher.start()
        try:
            yield
        finally:
            await server.batcher.stop()

    app = FastAPI(
        title="reprorl policy server", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.policy_server = server

    @app.middleware("http")
    async def policy_version_header(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        response.headers[POLICY_VERSION_HEADER] = sampler.policy_version
        return response

    install_error_handlers(app, max_body_bytes)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return server.health()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return server.models()

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionBody) -> dict[str, Any] | StreamingResponse:
        done = await server.completions(body)
        if not body.stream:
            return done
        return StreamingResponse(
            sse(completion_chunks(done, include_usage=body.include_usage())), media_type="text/event-stream"
        )

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatBody) -> dict[str, Any] | StreamingResponse:
        done = await server.chat(body)
        if not body.stream:
            return done
        return StreamingResponse(
            sse(chat_chunks(done, include_usage=body.include_usage())), media_type="text/event-stream"
        )

    @app.post("/v1/responses")
    async def responses(body: ResponsesBody) -> dict[str, Any]:
        return as_response(await server.chat(as_chat(body)))

    return app
