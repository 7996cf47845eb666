"""The policy server: an OpenAI-compatible HTTP front for one `LocalSampler`, concurrent requests batched.

It serves the subset of the OpenAI API that token-in/token-out sampling needs: `/v1/completions`
with the prompt as text or token ids (sampled tokens come back as `"token_id:N"`, vLLM's
convention), `/v1/chat/completions` rendered with the model's chat template, `/v1/models`, and
`/health` with the batcher's counters. Every response carries the served policy version in the
`x-reprorl-policy-version` header and as `system_fingerprint`. Bad input is a 400 with an OpenAI
error object; nothing a client sends can produce a traceback.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from reprorl.actions import CLOSE
from reprorl.hashing import derive_seed
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.http import POLICY_VERSION_HEADER, TOKEN_ID_PREFIX, tool_call_text
from reprorl.policy.sampling import LocalSampler, Sample, SampleRequest
from reprorl.serve.batcher import MicroBatcher
from reprorl.serve.schemas import ChatBody, ChatMessageBody, CompletionBody, SamplingBody
from reprorl.types import Message, SamplingParams

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /completions
CHAT_MAX_TOKENS = 256  # SamplingParams' default


class ApiError(Exception):
    """A request this server refuses, with the HTTP status and OpenAI error type to answer with."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        self.status = status
        self.message = message
        self.param = param
        super().__init__(message)


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "internal_error"
    if status == 404:
        kind = "not_found_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        if err.get("type") == "json_invalid":
            return f"the request body is not valid JSON: {err.get('ctx', {}).get('error', 'decode error')}"
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
    more = len(exc.errors()) - 3
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _openai_finish(sample: Sample) -> tuple[str, str | int | None]:
    """OpenAI's finish_reason plus vLLM's stop_reason (the stop string or token that ended the row)."""
    if sample.finish_reason == "length":
        return "length", None
    if sample.finish_reason == "tool_call":
        return "stop", CLOSE
    return "stop", sample.token_ids[-1] if sample.token_ids else None


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
        if body.stream:
            raise ApiError(400, "streaming is not supported; send stream=false", param="stream")
        if body.n != 1:
            raise ApiError(400, "only n=1 is supported; send one request per sample", param="n")
        unknown = [s for s in body.stop_strings() if s not in self.sampler.stop_strings]
        if unknown:
            raise ApiError(
                400,
                f"this server stops only at end-of-turn tokens and {list(self.sampler.stop_strings)}, "
                f"not at {unknown}",
                param="stop",
            )

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
        request = SampleRequest(key=f"req-{number}", prompt_ids=tuple(prompt_ids), params=params, seed=seed)
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

    def envelope(self, kind: str, sample: Sample, seed: int, prompt_tokens: int) -> dict[str, Any]:
        return {
            "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "system_fingerprint": sample.policy_version,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(sample.token_ids),
                "total_tokens": prompt_tokens + len(sample.token_ids),
            },
            # What a caller needs to record or replay this sample: seed and the batch it was in.
            "reprorl": {
                "policy_version": sample.policy_version,
                "seed": seed,
                "key": sample.key,
                "batch": list(sample.batch),
            },
        }

    @staticmethod
    def add_token_ids(
        choice: dict[str, Any], body: SamplingBody, prompt_ids: Sequence[int], sample: Sample
    ) -> None:
        """`return_token_ids` (vLLM and SGLang): the prompt's and the sample's ids on the choice."""
        if body.return_token_ids:
            choice["prompt_token_ids"] = list(prompt_ids)
            choice["token_ids"] = list(sample.token_ids)

    async def completions(self, body: CompletionBody) -> dict[str, Any]:
        self.check(body)
        if body.echo:
            raise ApiError(400, "echo is not supported", param="echo")
        if isinstance(body.prompt, str):
            prompt_ids = await self.batcher.run(self.renderer.encode, body.prompt)
        else:
            prompt_ids = list(body.prompt)
        sample, seed = await self.sample(prompt_ids, body, body.max_tokens or COMPLETION_MAX_TOKENS)
        text, pieces = await self.batcher.run(self.pieces, sample.token_ids, body.skip_special_tokens)
        logprobs = None
        if body.logprobs is not None:
            as_ids = body.return_tokens_as_token_ids
            logprobs = {
                "tokens": [f"{TOKEN_ID_PREFIX}{t}" for t in sample.token_ids] if as_ids else pieces,
                "token_logprobs": list(sample.logprobs),
                # Only the sampled token's logprob is computed; alternatives are not.
                "top_logprobs": None,
            }
        finish, stop_reason = _openai_finish(sample)
        choice = {
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish,
            "stop_reason": stop_reason,
        }
        self.add_token_ids(choice, body, prompt_ids, sample)
        return {**self.envelope("text_completion", sample, seed, len(prompt_ids)), "choices": [choice]}

    async def chat(self, body: ChatBody) -> dict[str, Any]:
        self.check(body)
        messages = [_message(m) for m in body.messages]
        tools = body.tools or []
        try:
            prompt_ids = await self.batcher.run(self.renderer.prompt_ids, messages, tools)
        except Exception as exc:
            raise ApiError(
                400, f"the chat template could not render these messages: {exc}", param="messages"
            ) from None
        max_tokens = body.max_completion_tokens or body.max_tokens or CHAT_MAX_TOKENS
        sample, seed = await self.sample(prompt_ids, body, max_tokens)
        text, pieces = await self.batcher.run(self.pieces, sample.token_ids, body.skip_special_tokens)
        logprobs = None
        if body.logprobs:
            as_ids = body.return_tokens_as_token_ids
            logprobs = {
                "content": [
                    {
                        "token": f"{TOKEN_ID_PREFIX}{t}" if as_ids else piece,
                        "logprob": lp,
                        # A piece that ends inside a UTF-8 character decodes to U+FFFD, not its bytes.
                        "bytes": None if "\ufffd" in piece else list(piece.encode("utf-8")),
                        "top_logprobs": [],
                    }
                    for t, lp, piece in zip(sample.token_ids, sample.logprobs, pieces, strict=True)
                ]
            }
        finish, stop_reason = _openai_finish(sample)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": logprobs,
            "finish_reason": finish,
            "stop_reason": stop_reason,
        }
        self.add_token_ids(choice, body, prompt_ids, sample)
        return {**self.envelope("chat.completion", sample, seed, len(prompt_ids)), "choices": [choice]}

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


def _message(body: ChatMessageBody) -> Message:
    """An OpenAI chat message as a reprorl message; structured tool calls become `<tool_call>` text."""
    if isinstance(body.content, list):
        texts = []
        for part in body.content:
            if part.type != "text" or part.text is None:
                raise ApiError(
                    400, f"content parts of type {part.type!r} are not supported", param="messages"
                )
            texts.append(part.text)
        content = "".join(texts)
    else:
        content = body.content or ""
    for call in body.tool_calls or []:
        content += tool_call_text(call.function.name, call.function.arguments)
    return Message(role=body.role, content=content, tool_call_id=body.tool_call_id, name=body.name)


def create_app(
    sampler: LocalSampler,
    renderer: ChatRenderer,
    *,
    model_name: str,
    seed: int = 0,
    window_s: float = 0.005,
    max_batch: int = 32,
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

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.param)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, _validation_message(exc))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"internal error ({type(exc).__name__}): {exc}")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return server.health()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return server.models()

    @app.post("/v1/completions")
    async def completions(body: CompletionBody) -> dict[str, Any]:
        return await server.completions(body)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody) -> dict[str, Any]:
        return await server.chat(body)

    return app
