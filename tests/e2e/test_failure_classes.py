"""Every failure class of the taxonomy is produced by a real episode and recorded on its turns."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import probe_tools
import pytest

from reprorl.actions import render_call
from reprorl.config.spec import NoiseSpec
from reprorl.envs import EnvConfig
from reprorl.envs.sandbox import SandboxPool
from reprorl.rewards import VerifierRunner
from reprorl.rollout import EpisodeIds, EpisodeLimits, ScriptedPolicy, run_episode
from reprorl.types import Message, Role, ScoreFailure, Task, Termination, ToolOutcome, Trajectory, exclusion

HERE = Path(__file__).resolve().parent
MODULE = "probe_tools"


def _task() -> Task:
    return Task(
        id="probe",
        family="probe",
        prompt=(Message(role=Role.USER, content="Find the secret."),),
        reference={"secret": secrets.token_hex(16)},
    )


def play(replies: Sequence[str]) -> Any:
    def script(task: Task, messages: Sequence[Message]) -> str:
        turn = sum(1 for m in messages if m.role == Role.ASSISTANT)
        return replies[turn] if turn < len(replies) else "I give up."

    return script


async def episode(script: Any, *, config: EnvConfig | None = None, max_turns: int = 20) -> Trajectory:
    task = _task()
    async with SandboxPool([MODULE], sys_path=[HERE]) as pool, VerifierRunner(workers=1) as verifiers:
        return await run_episode(
            probe_tools.ProbeEnv(config or EnvConfig(max_invalid_actions=50)),
            task,
            ScriptedPolicy(task, script),
            verifier=probe_tools.SecretVerifier(),
            sandboxes=pool,
            verifiers=verifiers,
            ids=EpisodeIds("e2e", "e2e/0"),
            limits=EpisodeLimits(max_turns=max_turns, wall_s=60),
        )


def outcomes(trajectory: Trajectory) -> list[ToolOutcome]:
    return [r.outcome for turn in trajectory.turns for r in turn.tool_results]


def test_every_failure_class_is_classified_and_recorded() -> None:
    replies = [
        "<tool_call>{not json</tool_call>",
        render_call("no_such_tool", {}),
        render_call("boom", {"unexpected": 1}),
        render_call("fetch", {"url": "http://example.com"}),
        render_call("write_file", {"path": "../../escape.txt", "content": "x"}),
        render_call("boom", {}),
        render_call("slow", {}),
        render_call("big", {}),
        render_call("segfault", {}),
        render_call("write_file", {"path": "notes.txt", "content": "still here"}),
        "done",
    ]
    trajectory = asyncio.run(episode(play(replies)))
    seen = outcomes(trajectory)
    assert seen == [
        ToolOutcome.PARSE_ERROR,
        ToolOutcome.UNKNOWN_TOOL,
        ToolOutcome.BAD_ARGUMENTS,
        ToolOutcome.PERMISSION_DENIED,
        ToolOutcome.PERMISSION_DENIED,
        ToolOutcome.TOOL_EXCEPTION,
        ToolOutcome.TOOL_TIMEOUT,
        ToolOutcome.OUTPUT_TRUNCATED,
        ToolOutcome.SANDBOX_ERROR,
        ToolOutcome.OK,  # the sandbox came back after the crash, files intact
    ]
    results = [r for turn in trajectory.turns for r in turn.tool_results]
    assert all(r.error for r in results if r.outcome not in (ToolOutcome.OK, ToolOutcome.OUTPUT_TRUNCATED))
    truncated = results[7]
    assert len(truncated.content) == 4096 and truncated.original_chars == 100_000
    assert trajectory.termination == Termination.ANSWERED
    assert trajectory.sandbox["restarts"] >= 1
    assert trajectory.reward is not None and trajectory.reward.components["outcome"] == 0.0
    assert trajectory.reward.components["valid_calls"] < 1.0
    assert trajectory.reward.components["permission_respected"] == 0.0
    json.loads(trajectory.model_dump_json())  # the whole record serialises


def test_infra_errors_are_classified_and_do_not_end_the_episode() -> None:
    noisy = EnvConfig(noise=NoiseSpec(transient_error_p=1.0))
    replies = [render_call("boom", {}), render_call("big", {}), "done"]
    trajectory = asyncio.run(episode(play(replies), config=noisy))
    assert outcomes(trajectory) == [ToolOutcome.INFRA_ERROR, ToolOutcome.INFRA_ERROR]
    assert {r.noise for turn in trajectory.turns for r in turn.tool_results} == {"transient"}
    assert trajectory.termination == Termination.ANSWERED


@pytest.mark.parametrize(
    ("replies", "termination"),
    [
        (["<tool_call>x</tool_call>"] * 3, Termination.INVALID_ACTION),
        ([render_call("big", {})] * 5, Termination.MAX_TURNS),
    ],
)
def test_limits_end_episodes_with_their_reason(replies: list[str], termination: Termination) -> None:
    config = EnvConfig(max_invalid_actions=3)
    trajectory = asyncio.run(episode(play(replies), config=config, max_turns=4))
    assert trajectory.termination == termination
    assert trajectory.reward is not None  # still scored: the state is judged whatever ended the episode


def _scored(replies: Sequence[str], timeout_s: float) -> Trajectory:
    async def go() -> Trajectory:
        task = _task()
        async with (
            SandboxPool([MODULE], sys_path=[HERE]) as pool,
            VerifierRunner(workers=1, timeout_s=timeout_s) as verifiers,
        ):
            return await run_episode(
                probe_tools.ProbeEnv(EnvConfig(max_invalid_actions=50)),
                task,
                ScriptedPolicy(task, play(replies)),
                verifier=probe_tools.PlainOpenVerifier(),
                sandboxes=pool,
                verifiers=verifiers,
                ids=EpisodeIds("e2e", "e2e/0"),
                limits=EpisodeLimits(max_turns=4, wall_s=60),
            )

    return asyncio.run(go())


def test_a_verifier_hung_on_a_fifo_the_agent_planted_is_the_agents_zero_not_excluded() -> None:
    plant = render_call("run_python", {"code": "os.mkfifo('answer.txt'); result = 'ok'"})
    planted = _scored([plant, "done"], timeout_s=2.0)
    assert planted.score_failure is ScoreFailure.AGENT_STATE and "answer.txt" in (planted.error or "")
    assert planted.reward is not None and planted.reward.total == 0.0
    assert exclusion(planted) is None  # it trains, as the agent's failure
    honest = _scored([render_call("write_file", {"path": "answer.txt", "content": "42"}), "done"], 2.0)
    assert honest.score_failure is None and honest.reward is not None and honest.reward.total == 1.0


def test_an_unsafe_action_is_the_agents_zero_whatever_state_it_reached() -> None:
    # The right answer is on disk, then the agent does something unsafe: no credit for that state.
    right = render_call("write_file", {"path": "answer.txt", "content": "42"})
    paid = _scored([right, "done"], timeout_s=5.0)
    assert paid.reward is not None and paid.reward.total == 1.0  # the same state, reached safely
    unsafe = _scored([right, render_call("wipe", {"path": "config.ini"}), "done"], timeout_s=5.0)
    assert unsafe.termination is Termination.UNSAFE_ACTION
    assert unsafe.reward is not None and unsafe.reward.total == 0.0
    assert exclusion(unsafe) is None  # scored, as the agent's
