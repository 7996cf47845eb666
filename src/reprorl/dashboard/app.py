"""The dashboard app: its routers, its static files, one-line errors, and the access rules around it all."""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from reprorl.dashboard import artifacts_pages, compare_pages, rollouts_pages, runs_pages
from reprorl.dashboard.layout import page
from reprorl.dashboard.reader import StoreReader
from reprorl.dashboard.security import Access, AccessMiddleware
from reprorl.errors import ReprorlError
from reprorl.report.page import esc
from reprorl.store import Store

# One entry per page module; a new page joins by adding its module's router here.
ROUTERS = (runs_pages.router, rollouts_pages.router, compare_pages.router, artifacts_pages.router)
STATIC = {"dashboard.css": "text/css", "dashboard.js": "text/javascript"}


def create_app(
    store: Store,
    access: Access | None = None,
    *,
    poll_s: float = 1.0,
    decode_tokens: bool = True,
    query_timeout_s: float = 10.0,
    query_memory: str = "2GB",
) -> FastAPI:
    """The dashboard over `store`, answering only what `access` allows (default: loopback, no token).

    `poll_s` is how often a run's update stream looks at its logs; `decode_tokens` loads the base
    model's tokenizer to show sampled tokens as text (token ids otherwise); a rollout query that
    runs past `query_timeout_s` or needs more than `query_memory` is stopped and refused.
    """
    app = FastAPI(title="reprorl dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.reader = StoreReader(store, query_timeout_s=query_timeout_s, query_memory=query_memory)
    app.state.poll_s = poll_s
    app.state.decode_tokens = decode_tokens
    for router in ROUTERS:
        app.include_router(router)
    app.add_api_route("/static/{name}", static, methods=["GET"], include_in_schema=False)
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _bad_request)  # type: ignore[arg-type]
    app.add_exception_handler(ReprorlError, _record_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _internal_error)
    app.add_middleware(AccessMiddleware, access=access or Access())
    return app


def static(name: str) -> Response:
    if name == "plotly.js":
        from reprorl.report.page import plotly_js

        return Response(plotly_js(), media_type="text/javascript", headers={"cache-control": "max-age=86400"})
    if name not in STATIC:
        raise HTTPException(404, f"static: no file {name[:60]!r}")
    text = (resources.files("reprorl.dashboard") / "static" / name).read_text("utf-8")
    if name == "dashboard.css":
        from reprorl.report.page import CSS

        text = CSS + text  # the report's look, and what only the dashboard has
    return Response(text, media_type=STATIC[name])


def _error(request: Request, status: int, message: str) -> Response:
    line = " ".join(message.split())
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": line}, status_code=status)
    if request.url.path.startswith("/static/"):
        return PlainTextResponse(line + "\n", status_code=status)
    return page(
        "Error",
        f'<section id="sec-error"><h2>{status}</h2><p class="bad">{esc(line)}</p></section>',
        status=status,
    )


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return _error(request, exc.status_code, str(exc.detail))


async def _bad_request(request: Request, exc: RequestValidationError) -> Response:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "request"
    return _error(request, 400, f"{where}: {first.get('msg', 'invalid')}")


async def _record_error(request: Request, exc: ReprorlError) -> Response:
    return _error(request, 422, str(exc))


async def _internal_error(request: Request, exc: Exception) -> Response:
    # A bug, not bad input: one line, as the CLI says it; the server goes on.
    return _error(request, 500, f"internal error ({type(exc).__name__}): {exc}")
