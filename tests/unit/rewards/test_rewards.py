"""Verifiers judge the final state safely; composition and process rewards; isolation with limits."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reprorl.config.data import check_reward_weights
from reprorl.rewards import (
    FinalState,
    StateAccessError,
    Verifier,
    VerifierRunner,
    compose,
    isolation,
    process_components,
)
from reprorl.rewards.verifiers.numeric import NumericAnswer, last_number
from reprorl.types import Message, Role, ScoreFailure, Task, Termination, ToolOutcome, ToolResult, Turn

TASK = Task(
    id="t", family="calculator", prompt=(Message(role=Role.USER, content="?"),), reference={"answer": 1234}
)


def _state(tmp_path: Path, answer: str | None) -> FinalState:
    return FinalState(answer=answer, workdir=tmp_path, termination=Termination.ANSWERED)


@pytest.mark.parametrize(
    ("answer", "score"),
    [
        ("1234", 1.0),
        ("The total is 1,234.", 1.0),
        ("1234.0", 1.0),
        ("1233", 0.0),
        ("", 0.0),
        (None, 0.0),
        ("1234 or maybe 99", 0.0),
    ],
)
def test_numeric_answer(tmp_path: Path, answer: str | None, score: float) -> None:
    assert NumericAnswer().score(TASK, _state(tmp_path, answer)) == {"outcome": score}


def test_last_number() -> None:
    assert last_number("a -12.5 b 7") == 7.0 and last_number("none") is None


def test_final_state_refuses_escapes_and_links(tmp_path: Path) -> None:
    (tmp_path / "ok.txt").write_text("fine")
    outside = tmp_path.parent / f"secret-{os.getpid()}.txt"
    outside.write_text("secret")
    try:
        (tmp_path / "link.txt").symlink_to(outside)
        (tmp_path / "dirlink").symlink_to(tmp_path.parent)
        state = _state(tmp_path, None)
        assert state.read_text("ok.txt") == "fine"
        assert state.read_text("missing.txt") is None
        for bad in ("../" + outside.name, str(outside), "link.txt", "dirlink/" + outside.name):
            with pytest.raises(StateAccessError):
                state.read_text(bad)
    finally:
        outside.unlink()


def test_compose_weights_and_keeps_unweighted_components() -> None:
    reward = compose({"outcome": 1.0, "valid_calls": 0.5}, {"outcome": 1.0, "valid_calls": 0.2}, "v1")
    assert reward.total == pytest.approx(1.1)
    assert compose({"outcome": 0.0, "valid_calls": 1.0}, {"outcome": 1.0}, "v1").total == 0.0
    assert (
        compose({"outcome": 0.0, "valid_calls": 1.0}, {"outcome": 1.0}, "v1").components["valid_calls"] == 1.0
    )


def test_process_components() -> None:
    def turn(*outcomes: ToolOutcome) -> Turn:
        return Turn(
            index=0, tool_results=tuple(ToolResult(call_id="c", name="t", outcome=o) for o in outcomes)
        )

    good = process_components([turn(ToolOutcome.OK, ToolOutcome.TOOL_EXCEPTION)])
    assert good == {"valid_calls": 1.0, "permission_respected": 1.0, "failed_calls": 1.0}
    bad = process_components(
        [turn(ToolOutcome.PARSE_ERROR, ToolOutcome.OK), turn(ToolOutcome.PERMISSION_DENIED)]
    )
    assert bad == {"valid_calls": 2 / 3, "permission_respected": 0.0, "failed_calls": 2.0}
    assert process_components([]) == {"valid_calls": 1.0, "permission_respected": 1.0, "failed_calls": 0.0}


def test_failed_calls_counts_the_agents_failures_only() -> None:
    """A count, not a share: easy calls added beside a failing one do not dilute it; a sandbox or
    infrastructure failure, or a truncated output, is not the agent's."""

    def calls(*outcomes: ToolOutcome) -> float:
        turns = [
            Turn(index=0, tool_results=tuple(ToolResult(call_id="c", name="t", outcome=o) for o in outcomes))
        ]
        return process_components(turns)["failed_calls"]

    assert (
        calls(ToolOutcome.TOOL_EXCEPTION) == calls(ToolOutcome.TOOL_EXCEPTION, *[ToolOutcome.OK] * 5) == 1.0
    )
    agent = (ToolOutcome.TOOL_TIMEOUT, ToolOutcome.BAD_ARGUMENTS, ToolOutcome.UNKNOWN_TOOL)
    assert calls(*agent) == 3.0
    not_agent = (
        ToolOutcome.SANDBOX_ERROR,
        ToolOutcome.INFRA_ERROR,
        ToolOutcome.OUTPUT_TRUNCATED,
        ToolOutcome.OK,
    )
    assert calls(*not_agent) == 0.0
    # Weighed as the config says, a retry after a failing call earns less than a first-time success.
    weights = {"outcome": 1.0, "failed_calls": -0.1}
    retry = compose({"outcome": 1.0, "failed_calls": 1.0}, weights, "v1")
    first = compose({"outcome": 1.0, "failed_calls": 0.0}, weights, "v1")
    assert retry.total == pytest.approx(0.9) and first.total == 1.0 and retry.success


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"outcome": 1.0, "failed_calls": 0.1}, "failed_calls = -0.1"),
        ({"outcome": float("nan")}, "finite"),
    ],
)
def test_reward_weights_that_cannot_mean_what_they_say_are_refused(
    weights: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        check_reward_weights(weights)
    check_reward_weights({"outcome": 1.0, "failed_calls": -0.1})


def test_verifier_version_follows_settings_and_code() -> None:
    assert NumericAnswer().version == NumericAnswer().version
    assert NumericAnswer(abs_tol=0.1).version != NumericAnswer().version
    assert HangingVerifier().version != NumericAnswer().version


@dataclass(frozen=True)
class HangingVerifier(Verifier):
    seconds: float = 60.0

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        time.sleep(self.seconds)
        return {"outcome": 1.0}


@dataclass(frozen=True)
class CrashingVerifier(Verifier):
    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        os._exit(3)


@dataclass(frozen=True)
class BuggyVerifier(Verifier):
    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        return {"outcome": float("nan")}


@dataclass(frozen=True)
class PidVerifier(Verifier):
    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        return {"outcome": 1.0, "pid": float(os.getpid())}


def test_runner_isolates_time_limits_and_failures(tmp_path: Path) -> None:
    async def go() -> None:
        async with VerifierRunner(workers=1, timeout_s=1.5) as runner:
            state = _state(tmp_path, "1234")
            ok, error = await runner.score(PidVerifier(), TASK, state)
            assert error is None and ok is not None and ok["pid"] != os.getpid()  # another process
            started = time.monotonic()
            none, why = await runner.score(HangingVerifier(), TASK, state)
            assert none is None and why is not None and "ran past" in why.message
            assert why.kind is ScoreFailure.VERIFIER_TIMEOUT
            assert time.monotonic() - started < 10
            none, why = await runner.score(CrashingVerifier(), TASK, state)
            assert none is None and why is not None and "crashed" in why.message
            assert why.kind is ScoreFailure.VERIFIER_CRASH
            none, why = await runner.score(BuggyVerifier(), TASK, state)
            assert none is None and why is not None and "nan" in why.message
            assert why.kind is ScoreFailure.VERIFIER_ERROR
            again, error = await runner.score(NumericAnswer(), TASK, state)  # the runner recovered
            assert again == {"outcome": 1.0} and error is None
            assert runner.restarts == 3  # the hung worker, and both the crashing verifier took

    asyncio.run(go())


def test_a_worker_killed_from_outside_mid_call_costs_a_retry_not_the_score(tmp_path: Path) -> None:
    """SIGKILL of the worker while it scores (an operator, the OOM killer): the call goes to a fresh
    worker and scores; only a verifier that kills its worker twice is a crash."""

    async def go() -> None:
        async with VerifierRunner(workers=1, timeout_s=30.0) as runner:
            state = _state(tmp_path, "1234")
            first, _ = await runner.score(PidVerifier(), TASK, state)
            assert first is not None
            call = asyncio.create_task(runner.score(SlowVerifier(2.0), TASK, state))
            await asyncio.sleep(0.8)  # the slow call is inside the worker
            os.kill(int(first["pid"]), signal.SIGKILL)
            components, why = await call
            assert why is None and components == {"outcome": 1.0}
            assert runner.restarts == 1
            again, _ = await runner.score(PidVerifier(), TASK, state)
            assert again is not None and again["pid"] != first["pid"]

    asyncio.run(go())


def test_a_whole_verifier_pool_killed_mid_call_costs_a_retry_not_the_score(tmp_path: Path) -> None:
    """Every worker killed at once (the pool's processes, not the verifier): the call in flight
    goes to a new worker, not to an idle one that died with the rest."""

    async def go() -> None:
        async with VerifierRunner(workers=2, timeout_s=30.0) as runner:
            state = _state(tmp_path, "1234")
            # Two slow calls at once start both workers; both go back idle.
            warm = await asyncio.gather(*(runner.score(SlowPidVerifier(0.5), TASK, state) for _ in range(2)))
            pids = {int(components["pid"]) for components, _ in warm if components is not None}
            assert len(pids) == 2
            call = asyncio.create_task(runner.score(SlowVerifier(2.0), TASK, state))
            await asyncio.sleep(0.8)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            components, why = await call
            assert why is None and components == {"outcome": 1.0}

    asyncio.run(go())


@pytest.mark.parametrize("killed_starts", [1, 2])
def test_a_worker_killed_as_it_starts_is_a_retry_then_a_classified_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, killed_starts: int
) -> None:
    """A pool killed at once takes a worker still starting: its first message meets a closed pipe.
    That start is tried again on a new worker; a second start lost too is a classified failure,
    never an exception out of `score`."""
    real = isolation.asyncio.create_subprocess_exec
    starts = 0

    async def killed_at_birth(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        nonlocal starts
        process = await real(*args, **kwargs)
        starts += 1
        if starts <= killed_starts:
            process.kill()
            await process.wait()
        return process

    monkeypatch.setattr(isolation.asyncio, "create_subprocess_exec", killed_at_birth)

    async def go() -> None:
        async with VerifierRunner(workers=1, timeout_s=30.0) as runner:
            components, why = await runner.score(PidVerifier(), TASK, _state(tmp_path, "1234"))
            if killed_starts == 1:
                assert why is None and components is not None and components["outcome"] == 1.0
            else:
                assert components is None and why is not None
                assert why.kind is ScoreFailure.VERIFIER_CRASH and "could start" in why.message
            assert runner.restarts == killed_starts

    asyncio.run(go())


@dataclass(frozen=True)
class SlowPidVerifier(Verifier):
    seconds: float = 0.5

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        time.sleep(self.seconds)
        return {"outcome": 1.0, "pid": float(os.getpid())}


def test_read_bytes_is_exact(tmp_path: Path) -> None:
    (tmp_path / "blob.bin").write_bytes(b"\xff\x00\xfe")
    assert _state(tmp_path, None).read_bytes("blob.bin") == b"\xff\x00\xfe"
    assert _state(tmp_path, None).read_bytes("nope.bin") is None


@dataclass(frozen=True)
class ReadsAnswerFile(Verifier):
    """Scores the file `answer.txt` of the final state, through the state's own reader."""

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        return {"outcome": float(state.read_text("answer.txt") == "1234")}


@dataclass(frozen=True)
class SlowVerifier(Verifier):
    seconds: float = 1.0

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        time.sleep(self.seconds)
        return {"outcome": 1.0}


def test_a_fifo_or_link_the_agent_planted_is_the_agents_zero_not_a_hung_verifier(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "answer.txt")  # opening it for reading would block forever
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "l").symlink_to("/etc/hostname")

    async def go() -> None:
        async with VerifierRunner(workers=1, timeout_s=5.0) as runner:
            started = time.monotonic()
            components, why = await runner.score(ReadsAnswerFile(), TASK, _state(tmp_path, None))
            assert time.monotonic() - started < 4  # refused at once, not the time limit
            assert components == {"outcome": 0.0}
            assert why is not None and why.kind is ScoreFailure.AGENT_STATE and "not a regular" in why.message
            assert runner.restarts == 0

    asyncio.run(go())
    assert sorted(_state(tmp_path, None).special_entries()) == ["answer.txt", "sub/l"]


def test_a_hung_call_costs_its_own_worker_and_never_the_call_beside_it(tmp_path: Path) -> None:
    async def go() -> None:
        async with VerifierRunner(workers=2, timeout_s=1.5) as runner:
            state = _state(tmp_path, "1234")
            warm = await runner.score(PidVerifier(), TASK, state)  # one worker started; the hung call gets it
            hung = asyncio.create_task(runner.score(HangingVerifier(), TASK, state))
            await asyncio.sleep(1.0)  # the slow call is running when the hung one's worker is killed
            slow = await runner.score(SlowVerifier(1.0), TASK, state)
            none, why = await hung
            assert none is None and why is not None and why.kind is ScoreFailure.VERIFIER_TIMEOUT
            assert slow == ({"outcome": 1.0}, None)
            assert runner.restarts == 1
            after = await runner.score(PidVerifier(), TASK, state)
            assert warm[0] is not None and after[0] is not None
            assert after[0]["pid"] != warm[0]["pid"]  # the hung call's worker was killed, not reused

    asyncio.run(go())
