"""How reprorl's OpenAI-compatible servers refuse a request: OpenAI error objects, and a body cap read first.

Every refusal is `{"error": {"message", "type", "param", "code"}}` with the HTTP status, never a
traceback. The body cap is enforced as the bytes arrive, before anything parses them: a declared
`Content-Length` over the cap is answered 413 at once, and a chunked body is cut off at the cap, so
a 10 MB request costs the server neither a JSON parse nor a tokenisation, and the requests beside
it are not held up.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


class ApiError(Exception):
    """A request a server refuses, with the HTTP status and OpenAI error type to answer with."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        self.status = status
        self.message = message
        self.param = param
        super().__init__(message)


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "internal_error"
    if status == 404:
        kind = "not_found_error"
    elif status == 401:
        kind = "authentication_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


def validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        if err.get("type") == "json_invalid":
            return f"the request body is not valid JSON: {err.get('ctx', {}).get('error', 'decode error')}"
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
    more = len(exc.errors()) - 3
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


class BodyCap:
    """ASGI middleware: a request body over `limit` bytes is refused with a 413 before it is parsed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._refuse(scope, receive, send)
            return
        seen, refused = 0, False

        async def counted() -> Message:
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request" and not refused:
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # Answer now, and tell the app the client has gone, so it parses nothing.
                    refused = True
                    await self._refuse(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def unless_refused(message: Message) -> None:
            if not refused:  # the app's own answer to a body it never got is dropped
                await send(message)

        await self.app(scope, counted, unless_refused)

    def _message(self) -> str:
        return f"the request body is larger than {self.limit} bytes"

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await error_response(413, self._message())(scope, receive, send)


def install_error_handlers(app: FastAPI, max_body_bytes: int) -> None:
    """OpenAI error objects for every refusal on `app`, and the body cap in front of it."""
    app.add_middleware(BodyCap, limit=max_body_bytes)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, validation_message(exc))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error ({type(exc).__name__}): {exc}")
