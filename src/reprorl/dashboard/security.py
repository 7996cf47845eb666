"""Dashboard access: who may ask (token, host), what a request may name (no path escapes the store).

Bound to a loopback address the dashboard needs no token, but it still answers only requests whose
`Host` names a loopback address, so a page on another site cannot reach it through DNS rebinding.
Bound anywhere else it needs the token on every request: as `Authorization: Bearer`, as the cookie
the first visit with `?token=` sets, or as that query parameter. A request that changes anything
(a replay) must carry the `X-Reprorl-Request` header, which a cross-site form cannot send, so a
page the user visits cannot make the dashboard work for it.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reprorl.errors import UserInputError
from reprorl.store.runs import RUN_ID_RE

TOKEN_COOKIE = "reprorl_dashboard"
TOKEN_PARAM = "token"
MIN_TOKEN_CHARS = 16
WRITE_HEADER = "x-reprorl-request"
LOOPBACK_NAMES = frozenset({"localhost"})
# Only our own files: scripts and styles from this origin, plotly's injected styles, data URIs
# for the images plotly exports, nothing framed and no form posted elsewhere.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "connect-src 'self'; font-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
)
_TOKEN = re.compile(rf"[A-Za-z0-9._~\-]{{{MIN_TOKEN_CHARS},512}}")
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\\]")


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name) is this machine only."""
    name = host.strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Access:
    """Who the dashboard answers: the address it is bound to and, off loopback, the token it needs."""

    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None

    def __post_init__(self) -> None:
        if self.token is not None and not _TOKEN.fullmatch(self.token):
            raise UserInputError(
                f"must be {MIN_TOKEN_CHARS} to 512 of A-Z a-z 0-9 . _ ~ - (it travels in a URL and a "
                "cookie), or left out for a random one",
                field="token",
            )

    @classmethod
    def for_bind(cls, host: str, port: int, token: str | None = None) -> Access:
        """A bind off loopback always has a token: the one given, or a new random one."""
        if token is None and not is_loopback(host):
            token = secrets.token_urlsafe(24)
        return cls(host, port, token)

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def host_allowed(self, header: str) -> bool:
        """A loopback bind answers only requests addressed to a loopback name (DNS rebinding)."""
        if not self.loopback:
            return True
        name = header.rsplit(":", 1)[0] if not header.endswith("]") else header
        return is_loopback(name)

    def token_ok(self, given: str | None) -> bool:
        if self.token is None:
            return True
        return given is not None and secrets.compare_digest(given.encode(), self.token.encode())


class AccessMiddleware:
    """Refuses what `Access` does not allow, and sets the security headers on every answer."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app, self.access = app, access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no route speaks websockets: nothing else gets past this point
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = _query_token(scope.get("query_string", b"").decode("latin-1"))
        refusal = self._refusal(scope, headers, query)
        if refusal is not None:
            status, text = refusal
            await _plain(send, status, text)
            return
        # Only the right token in the URL sets the cookie, and the cookie holds our own copy of it.
        set_cookie = query is not None and self.access.token is not None and self.access.token_ok(query)
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                present = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in HEADERS if k not in present]
                if set_cookie:
                    cookie = f"{self.cookie}={self.access.token}; HttpOnly; SameSite=Strict; Path=/"
                    extra.append((b"set-cookie", cookie.encode("latin-1")))
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception as exc:
            # A bug answers with one line and the same headers as every other answer.
            if started:
                raise
            await _plain(send, 500, f"internal error ({type(exc).__name__}): {' '.join(str(exc).split())}\n")

    @property
    def cookie(self) -> str:
        """One cookie per port: two dashboards on one host keep their own tokens."""
        return f"{TOKEN_COOKIE}_{self.access.port}"

    def _refusal(self, scope: Scope, headers: dict[str, str], query: str | None) -> tuple[int, str] | None:
        if not self.access.host_allowed(headers.get("host", "")):
            return 421, "this dashboard answers only requests addressed to a loopback host\n"
        if not self.access.token_ok(_given_token(headers, query, self.cookie)):
            return 401, "a token is required: open the URL the dashboard printed at start\n"
        if scope["method"] not in ("GET", "HEAD") and headers.get(WRITE_HEADER) != "1":
            return 403, f"a request that runs work needs the {WRITE_HEADER} header\n"
        # A page on another site may link here (a navigation), but not make the browser fetch data
        # or run queries in its name (an image, a script, a fetch).
        if headers.get("sec-fetch-site") == "cross-site" and headers.get("sec-fetch-mode") != "navigate":
            return 403, "cross-site requests are refused; open the dashboard's own pages\n"
        return None


def _given_token(headers: dict[str, str], query: str | None, cookie: str) -> str | None:
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    for part in headers.get("cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == cookie:
            return value
    return query


def _query_token(query: str) -> str | None:
    from urllib.parse import parse_qs

    values = parse_qs(query).get(TOKEN_PARAM)
    return values[0] if values else None


async def _plain(send: Send, status: int, text: str) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), *HEADERS]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def refuse(field: str, why: str, status: int = 400) -> HTTPException:
    return HTTPException(status, f"{field}: {why}")


def checked_segment(value: str, field: str) -> str:
    """A value that will name a file or folder: one plain name, never a path of its own."""
    if not value or value in (".", "..") or "/" in value or _FORBIDDEN.search(value):
        raise refuse(field, f"{value[:80]!r} is not a plain name (no '/', '..', '\\' or control characters)")
    return value


def checked_run_id(value: str) -> str:
    """A run id exactly as reprorl makes them; anything else is refused before a path is built."""
    checked_segment(value, "run")
    if not RUN_ID_RE.fullmatch(value):
        raise refuse("run", f"{value[:80]!r} is not a run id (YYYYMMDDTHHMMSSffffffZ-xxxxxx)")
    return value


def inside(root: Path, *parts: str) -> Path:
    """`root/parts…`, refused unless it resolves inside `root` (a link cannot lead out either)."""
    target = root.joinpath(*parts).resolve()
    if not target.is_relative_to(root.resolve()):
        raise refuse("path", "resolves outside the store")
    return target
