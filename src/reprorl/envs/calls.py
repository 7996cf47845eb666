"""The failure taxonomy for tool calls: every call's result is classified at one boundary.

Agent errors (parse_error, unknown_tool, bad_arguments, permission_denied) are the model's;
tool_exception and tool_timeout are the tool's; sandbox_error and infra_error are the platform's and
are never held against the agent. Output longer than the env's limit is cut and flagged
`output_truncated`, because a silently cut result looks like a wrong one.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from reprorl.envs.sandbox import CallResult
from reprorl.types import Termination, ToolOutcome, ToolResult

_PERMISSION_ERRORS = frozenset({"PermissionError", "OutsideSandbox"})
_CPU_SIGNALS = frozenset({signal.SIGXCPU, signal.SIGKILL})
MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class CallOutcome:
    """A classified tool result, and the termination it forces (unsafe action), if any."""

    result: ToolResult
    terminates: Termination | None = None

    @classmethod
    def error(cls, call_id: str, name: str, outcome: ToolOutcome, detail: str) -> CallOutcome:
        return cls(ToolResult(call_id=call_id, name=name, outcome=outcome, error=detail[:MAX_ERROR_CHARS]))

    @classmethod
    def ok(cls, call_id: str, name: str, content: str, duration_s: float, cap: int) -> CallOutcome:
        return cls(_ok_result(call_id, name, content, len(content), duration_s, cap))

    @classmethod
    def of(cls, call_id: str, name: str, result: ToolResult, duration_s: float) -> CallOutcome:
        return cls(result.model_copy(update={"call_id": call_id, "name": name, "duration_s": duration_s}))


def _ok_result(
    call_id: str, name: str, content: str, full_chars: int, duration_s: float, cap: int
) -> ToolResult:
    if full_chars > cap or len(content) > cap:
        return ToolResult(
            call_id=call_id,
            name=name,
            outcome=ToolOutcome.OUTPUT_TRUNCATED,
            content=content[:cap],
            duration_s=duration_s,
            original_chars=max(full_chars, len(content)),
        )
    return ToolResult(
        call_id=call_id, name=name, outcome=ToolOutcome.OK, content=content, duration_s=duration_s
    )


def classify_call(call_id: str, name: str, result: CallResult, cap: int) -> CallOutcome:
    """Map what the sandbox reported to exactly one outcome class."""
    duration = result.duration_s
    if result.ok:
        full = max(result.output_chars, len(result.value))
        return CallOutcome(_ok_result(call_id, name, result.value, full, duration, cap))

    def failed(outcome: ToolOutcome, detail: str, terminates: Termination | None = None) -> CallOutcome:
        return CallOutcome(
            ToolResult(
                call_id=call_id,
                name=name,
                outcome=outcome,
                error=detail[:MAX_ERROR_CHARS],
                duration_s=duration,
            ),
            terminates,
        )

    message = result.error or ""
    if result.timed_out:
        return failed(ToolOutcome.TOOL_TIMEOUT, f"the call ran past its time limit ({duration:.1f} s)")
    if result.crashed:
        if result.signal in _CPU_SIGNALS:
            return failed(ToolOutcome.TOOL_TIMEOUT, f"the call exceeded its CPU limit ({message})")
        return failed(ToolOutcome.SANDBOX_ERROR, f"the sandbox process died: {message}")
    kind = result.error_type or "Exception"
    if kind == "UnsafeAction":
        return failed(
            ToolOutcome.PERMISSION_DENIED, f"unsafe action refused: {message}", Termination.UNSAFE_ACTION
        )
    if kind in _PERMISSION_ERRORS:
        return failed(ToolOutcome.PERMISSION_DENIED, f"{kind}: {message}")
    if kind == "InvalidArguments":
        return failed(ToolOutcome.BAD_ARGUMENTS, message)
    if kind in ("SandboxError", "InfraError"):
        return failed(ToolOutcome.INFRA_ERROR, f"{kind}: {message}")
    return failed(ToolOutcome.TOOL_EXCEPTION, f"{kind}: {message}")
