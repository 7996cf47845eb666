"""The outcome of one sandboxed tool call, with every way it can fail told apart."""

from __future__ import annotations

import os
import signal as signal_module
from dataclasses import asdict, dataclass
from typing import Any

from reprorl.envs.sandbox.protocol import ProtocolError

MAX_ERROR_CHARS = 2000
MAX_ERROR_TYPE_CHARS = 200

TIMEOUT_ERROR = "TimeoutError"
CRASH_ERROR = "SandboxCrashed"
PROTOCOL_ERROR = "SandboxProtocolError"


@dataclass(frozen=True)
class CallResult:
    """What a tool call returned or how it failed; a failure of the tool is data, never an exception."""

    ok: bool
    value: str
    error_type: str | None
    """Class name of the exception the tool raised; TimeoutError, SandboxCrashed or
    SandboxProtocolError when the sandbox itself failed."""
    error: str | None
    timed_out: bool
    crashed: bool
    """The sandbox process died during the call (a signal such as SIGXCPU, or an exit)."""
    duration_s: float
    output_chars: int = 0
    """Length of the tool's full result; larger than `len(value)` when it was cut."""
    signal: int | None = None
    """The signal that killed the sandbox process, when it was killed by one."""
    cpu_s: float | None = None
    """CPU seconds the dead sandbox process had used (its reaped rusage), when known."""

    @property
    def truncated(self) -> bool:
        return self.output_chars > len(self.value)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "truncated": self.truncated}


def bounded(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def timed_out(timeout_s: float, duration_s: float) -> CallResult:
    return CallResult(
        ok=False,
        value="",
        error_type=TIMEOUT_ERROR,
        error=f"the call ran past its wall-clock limit of {timeout_s:g} s; its processes were killed",
        timed_out=True,
        crashed=False,
        duration_s=duration_s,
    )


def crashed(
    status: int | None, duration_s: float, detail: str = "", cpu_s: float | None = None
) -> CallResult:
    """A call whose sandbox process died; `status` is the raw wait status, None when unknown."""
    signum: int | None = None
    if status is None:
        what = "the sandbox process died (exit status unknown)"
    elif (sig := _signal_of(status)) is not None:
        signum = sig
        what = f"the sandbox process was killed by {_signal_name(sig)}"
    else:
        what = f"the sandbox process exited with code {_exit_code(status)}"
    if cpu_s is not None:
        what += f" after {cpu_s:.2f} CPU-s"
    return CallResult(
        ok=False,
        value="",
        error_type=CRASH_ERROR,
        error=bounded(f"{what}{' (' + detail + ')' if detail else ''}"),
        timed_out=False,
        crashed=True,
        duration_s=duration_s,
        signal=signum,
        cpu_s=cpu_s,
    )


def protocol_violation(detail: str, duration_s: float) -> CallResult:
    return CallResult(
        ok=False,
        value="",
        error_type=PROTOCOL_ERROR,
        error=bounded(f"the sandbox process broke the call protocol ({detail}); it was killed"),
        timed_out=False,
        crashed=True,
        duration_s=duration_s,
    )


def from_reply(reply: Any, call_id: int, cap: int, duration: float) -> CallResult:
    """Turn an untrusted reply frame into a CallResult; anything out of shape is a protocol violation."""
    if not isinstance(reply, dict) or reply.get("id") != call_id:
        raise ProtocolError("reply does not answer this call")
    ok, value, chars = reply.get("ok"), reply.get("value", ""), reply.get("output_chars", 0)
    error_type, error = reply.get("error_type"), reply.get("error")
    if not isinstance(ok, bool) or not isinstance(value, str) or type(chars) is not int:
        raise ProtocolError("reply fields have the wrong types")
    if not all(v is None or isinstance(v, str) for v in (error_type, error)):
        raise ProtocolError("reply error fields have the wrong types")
    value = _clean_text(value[:cap])
    return CallResult(
        ok=ok,
        value=value,
        error_type=None if ok else bounded(error_type or "Exception", MAX_ERROR_TYPE_CHARS),
        error=None if ok else _clean_text(bounded(error or "")),
        timed_out=False,
        crashed=False,
        duration_s=duration,
        output_chars=max(chars, len(value)),
    )


def _clean_text(text: str) -> str:
    """Lone surrogates survive JSON but not Parquet or UTF-8 files downstream; replace them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _signal_of(status: int) -> int | None:
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else None


def _exit_code(status: int) -> int:
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else status


def _signal_name(signum: int) -> str:
    try:
        return signal_module.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
