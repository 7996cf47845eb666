"""The agent proxy: an OpenAI-compatible server on 127.0.0.1 through which agent programs run their episodes.

Each live rollout has an `Exchange` and a key of its own. A request reaches its rollout by path
(`/r/<rollout_id>/v1/chat/completions`) or by key alone (`/v1/chat/completions` with
`Authorization: Bearer <key>`); either way the key must be the rollout's, so one agent cannot write
into another's record. Chat completions (streamed too), the Responses API's text and function-call
items, and `/v1/models` are served; bodies are capped before parsing. The server runs in the
rollout runner's event loop, so a request awaits the runner's lockstep directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from reprorl.openai_api.api_errors import DEFAULT_MAX_BODY_BYTES, ApiError, install_error_handlers
from reprorl.openai_api.responses_api import ResponsesBody, as_chat, as_response
from reprorl.openai_api.schemas import ChatBody
from reprorl.openai_api.streaming import chat_chunks, sse
from reprorl.rollout.agents.exchange import Exchange

MODEL_NAME = "policy"
START_TIMEOUT_S = 30.0


class _InLoopServer(uvicorn.Server):
    """uvicorn inside a run: the run's own signal handlers stay (Ctrl-C stops the run, not the proxy)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class AgentProxy:
    """The rollouts open behind the proxy, and the server that serves them; an async context manager."""

    def __init__(
        self, *, host: str = "127.0.0.1", port: int = 0, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    ) -> None:
        self.host, self.port = host, port
        self.exchanges: dict[str, Exchange] = {}
        self._by_key: dict[str, str] = {}
        self.app = self._app(max_body_bytes)
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    # -- rollouts --------------------------------------------------------------------------------

    @staticmethod
    def new_key() -> str:
        return f"rk-{secrets.token_urlsafe(24)}"

    def base_url(self, rollout_id: str) -> str:
        return f"http://{self.host}:{self.port}/r/{rollout_id}/v1"

    def open(self, exchange: Exchange) -> None:
        if exchange.rollout_id in self.exchanges:
            raise RuntimeError(f"rollout {exchange.rollout_id} is already open behind the proxy")
        self.exchanges[exchange.rollout_id] = exchange
        self._by_key[exchange.key] = exchange.rollout_id

    def close(self, exchange: Exchange) -> None:
        self.exchanges.pop(exchange.rollout_id, None)
        self._by_key.pop(exchange.key, None)

    def _exchange(self, request: Request, rollout_id: str | None) -> Exchange:
        header = request.headers.get("authorization", "")
        key = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        if rollout_id is None:
            rollout_id = self._by_key.get(key)
            if rollout_id is None:
                raise ApiError(401, "no open rollout has this API key")
        exchange = self.exchanges.get(rollout_id)
        if exchange is None:
            raise ApiError(404, f"no rollout {rollout_id!r} is open behind this proxy")
        if not secrets.compare_digest(key.encode(), exchange.key.encode()):
            raise ApiError(401, f"the API key is not rollout {rollout_id!r}'s")
        return exchange

    # -- the server ------------------------------------------------------------------------------

    async def __aenter__(self) -> AgentProxy:
        config = uvicorn.Config(
            self.app, host=self.host, port=self.port, lifespan="off", log_level="warning", access_log=False
        )
        self._server = _InLoopServer(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve())
        async with asyncio.timeout(START_TIMEOUT_S):
            while not self._server.started:
                if self._task.done():
                    self._task.result()  # raises what stopped the server (a port in use)
                    raise RuntimeError("the agent proxy stopped before it started")
                await asyncio.sleep(0.01)
        sockets = [s for server in self._server.servers for s in server.sockets]
        self.port = int(sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._server = self._task = None

    def _app(self, max_body_bytes: int) -> FastAPI:
        app = FastAPI(title="reprorl agent proxy", docs_url=None, redoc_url=None, openapi_url=None)
        install_error_handlers(app, max_body_bytes)

        async def chat(request: Request, body: ChatBody, rollout_id: str | None) -> Any:
            done = await self._exchange(request, rollout_id).chat(body)
            if not body.stream:
                return done
            chunks = chat_chunks(done, include_usage=body.include_usage())
            return StreamingResponse(sse(chunks), media_type="text/event-stream")

        async def responses(request: Request, body: ResponsesBody, rollout_id: str | None) -> Any:
            exchange = self._exchange(request, rollout_id)
            return as_response(await exchange.chat(as_chat(body)))

        def models(request: Request, rollout_id: str | None) -> dict[str, Any]:
            self._exchange(request, rollout_id)
            entry = {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "reprorl"}
            return {"object": "list", "data": [entry]}

        @app.post("/r/{rollout_id:path}/v1/chat/completions", response_model=None)
        async def chat_by_path(request: Request, body: ChatBody, rollout_id: str) -> Any:
            return await chat(request, body, rollout_id)

        @app.post("/v1/chat/completions", response_model=None)
        async def chat_by_key(request: Request, body: ChatBody) -> Any:
            return await chat(request, body, None)

        @app.post("/r/{rollout_id:path}/v1/responses", response_model=None)
        async def responses_by_path(request: Request, body: ResponsesBody, rollout_id: str) -> Any:
            return await responses(request, body, rollout_id)

        @app.post("/v1/responses", response_model=None)
        async def responses_by_key(request: Request, body: ResponsesBody) -> Any:
            return await responses(request, body, None)

        @app.get("/r/{rollout_id:path}/v1/models")
        async def models_by_path(request: Request, rollout_id: str) -> dict[str, Any]:
            return models(request, rollout_id)

        @app.get("/v1/models")
        async def models_by_key(request: Request) -> dict[str, Any]:
            return models(request, None)

        return app
