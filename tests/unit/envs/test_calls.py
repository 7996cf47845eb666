"""Every sandbox result maps to exactly one outcome class, and noise is deterministic per seed."""

from __future__ import annotations

import asyncio
import signal

import pytest

from reprorl.config.spec import NoiseSpec
from reprorl.envs.calls import CallOutcome, classify_call
from reprorl.envs.families.calculator import calc
from reprorl.envs.noise import NoiseInjector
from reprorl.envs.sandbox import CallResult
from reprorl.types import Termination, ToolOutcome


def _result(**kw: object) -> CallResult:
    base: dict[str, object] = {
        "ok": False,
        "value": "",
        "error_type": None,
        "error": None,
        "timed_out": False,
        "crashed": False,
        "duration_s": 0.01,
    }
    base.update(kw)
    return CallResult(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("result", "outcome", "terminates"),
    [
        (_result(ok=True, value="4"), ToolOutcome.OK, None),
        (_result(ok=True, value="x" * 50), ToolOutcome.OUTPUT_TRUNCATED, None),
        (_result(timed_out=True), ToolOutcome.TOOL_TIMEOUT, None),
        (_result(crashed=True, signal=int(signal.SIGXCPU), error="SIGXCPU"), ToolOutcome.TOOL_TIMEOUT, None),
        (_result(crashed=True, signal=int(signal.SIGSEGV), error="SIGSEGV"), ToolOutcome.SANDBOX_ERROR, None),
        (
            _result(error_type="UnsafeAction", error="DROP"),
            ToolOutcome.PERMISSION_DENIED,
            Termination.UNSAFE_ACTION,
        ),
        (_result(error_type="OutsideSandbox", error="../x"), ToolOutcome.PERMISSION_DENIED, None),
        (_result(error_type="PermissionError", error="EACCES"), ToolOutcome.PERMISSION_DENIED, None),
        (_result(error_type="InvalidArguments", error="empty"), ToolOutcome.BAD_ARGUMENTS, None),
        (_result(error_type="SandboxError", error="pipe"), ToolOutcome.INFRA_ERROR, None),
        (_result(error_type="KeyError", error="'x'"), ToolOutcome.TOOL_EXCEPTION, None),
        (_result(error_type="MemoryError", error=""), ToolOutcome.TOOL_EXCEPTION, None),
    ],
)
def test_classification(result: CallResult, outcome: ToolOutcome, terminates: Termination | None) -> None:
    classified = classify_call("c1", "calc", result, cap=20)
    assert classified.result.outcome == outcome
    assert classified.terminates == terminates
    if outcome == ToolOutcome.OUTPUT_TRUNCATED:
        assert classified.result.content == "x" * 20 and classified.result.original_chars == 50


def test_sandbox_side_truncation_is_flagged_even_under_the_cap() -> None:
    result = _result(ok=True, value="abc", output_chars=10_000)
    classified = classify_call("c", "cat", result, cap=4096)
    assert classified.result.outcome == ToolOutcome.OUTPUT_TRUNCATED
    assert classified.result.original_chars == 10_000


def _run_noise(spec: NoiseSpec, seed: int, calls: int = 200) -> list[tuple[str, str | None]]:
    async def go() -> list[tuple[str, str | None]]:
        noise = NoiseInjector(spec, seed)
        seen: list[tuple[str, str | None]] = []
        for _ in range(calls):
            injected = await noise.before_call(calc)
            if injected is not None:
                seen.append((injected.outcome.value, injected.noise))
                continue
            stale = noise.stale(calc)
            after = noise.after_call(CallOutcome.ok("c", "calc", "0123456789", 0.0, 100), stale=stale)
            seen.append((after.result.outcome.value, after.result.noise))
        return seen

    return asyncio.run(go())


def test_noise_is_deterministic_per_seed_and_hits_every_kind() -> None:
    spec = NoiseSpec(timeout_p=0.1, transient_error_p=0.1, stale_p=0.2, truncate_p=0.2)
    first, again, other = _run_noise(spec, 7), _run_noise(spec, 7), _run_noise(spec, 8)
    assert first == again
    assert first != other
    kinds = {noise for _, noise in first}
    assert {"timeout", "transient", "stale", "truncate", None} <= kinds
    rate = sum(1 for o, _ in first if o == "tool_timeout") / len(first)
    assert 0.03 < rate < 0.2


def test_no_noise_means_no_draws_and_no_delay() -> None:
    assert _run_noise(NoiseSpec(), 1, calls=20) == [("ok", None)] * 20
