"""The transport to a model server: one pooled HTTP client, explicit timeouts, bounded retries with backoff.

Connection errors, timeouts, 429 and 5xx are transient: the request is sent again after an
exponentially growing pause (a server's Retry-After is a floor, the cap a ceiling). Any other 4xx
means the server understood and refused, so it is not retried. What still fails is an
`InferenceError` naming the URL, the attempts and the last error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from reprorl.errors import InferenceError, UserInputError

_ERROR_SNIPPET = 300


@dataclass(frozen=True)
class RetryPolicy:
    """How many times, and how patiently, a request is retried after a transient failure."""

    retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise UserInputError("retries and backoff times cannot be negative", field="retry")

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt `attempt` (0-based); a server's Retry-After is a floor."""
        wait = self.backoff_s * float(2**attempt)
        if retry_after is not None:
            wait = max(wait, retry_after)
        return min(wait, self.max_backoff_s)


@dataclass(frozen=True)
class Reply:
    body: dict[str, Any]
    headers: httpx.Headers


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date or garbage: the backoff schedule alone decides


class Endpoint:
    """One OpenAI-compatible server: a pooled client, explicit timeouts, bounded retries."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        retry: RetryPolicy,
        api_key_env: str | None,
        max_connections: int,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise UserInputError(f"{base_url!r} is not an http:// or https:// URL", field="base_url")
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise UserInputError("timeouts must be positive", field="timeout_s")
        self.base_url = base_url.rstrip("/")
        self.retry = retry
        self.timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        headers: dict[str, str] = {}
        if api_key_env is not None:
            key = os.environ.get(api_key_env, "")
            if not key:
                raise UserInputError(f"environment variable {api_key_env} (the API key) is not set")
            # Held by the client only: never an attribute, so it cannot leak into info() or records.
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(
            timeout=self.timeout,
            headers=headers,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    def post(self, path: str, body: Mapping[str, Any]) -> Reply:
        """POST JSON; retry transient failures; raise InferenceError when the server cannot answer."""
        url = f"{self.base_url}{path}"
        last = "no attempt made"
        status: int | None = None
        attempts = self.retry.retries + 1
        for attempt in range(attempts):
            retry_after: float | None = None
            try:
                response = self._client.post(url, json=body, timeout=self.timeout)
            except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                last, status = f"{type(exc).__name__}: {exc}".rstrip(": "), None
            else:
                status = response.status_code
                if status < 400:
                    return Reply(json_object(response, url, attempt + 1), response.headers)
                last = f"HTTP {status}: {snippet(response.text)}"
                if status != 429 and status < 500:
                    # The server understood and refused: the same request would be refused again.
                    raise InferenceError(
                        f"POST {url} was refused: {last}", status=status, attempts=attempt + 1
                    )
                retry_after = _retry_after(response)
            if attempt + 1 < attempts:
                time.sleep(self.retry.delay(attempt, retry_after))
        raise InferenceError(
            f"POST {url} failed after {attempts} attempt{'s' if attempts != 1 else ''}: {last}",
            status=status,
            attempts=attempts,
        )

    def close(self) -> None:
        self._client.close()


def snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _ERROR_SNIPPET else flat[:_ERROR_SNIPPET] + "…"


def json_object(response: httpx.Response, url: str, attempts: int) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise InferenceError(
            f"POST {url} answered {response.status_code} with a body that is not a JSON object: "
            f"{snippet(response.text)}",
            status=response.status_code,
            attempts=attempts,
        )
    return body
