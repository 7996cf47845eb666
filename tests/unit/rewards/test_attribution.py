"""Who a failure belongs to (docs/envs.md): the agent's are scored, at 0 where nothing was earned; the
platform's, the verifier's and the judge's leave the rollout out and are counted by class."""

from __future__ import annotations

import pytest

from reprorl.actions import CLOSE, OPEN, parse_action
from reprorl.types import Reward, ScoreFailure, Split, Termination, Trajectory, exclusion

ZERO = Reward(total=0.0, components={"outcome": 0.0}, verifier_version="sha256:v")
AGENTS = [
    Termination.ANSWERED,
    Termination.MAX_TURNS,
    Termination.MAX_TOKENS,
    Termination.MAX_WALL_TIME,
    Termination.TOOL_TIMEOUT,
    Termination.INVALID_ACTION,
    Termination.UNSAFE_ACTION,
    Termination.AGENT_ERROR,
    Termination.ENV_DONE,
]


def rollout(
    termination: Termination, reward: Reward | None, failure: ScoreFailure | None = None, **kw: object
) -> Trajectory:
    return Trajectory(
        run_id="r",
        rollout_id="r/1",
        split=Split.TRAIN,
        task_id="t",
        task_hash="sha256:t",
        termination=termination,
        reward=reward,
        score_failure=failure,
        **kw,  # type: ignore[arg-type]
    )


def test_every_termination_has_an_owner() -> None:
    platform = {Termination.INFRA_ERROR, Termination.SANDBOX_ERROR}
    assert set(AGENTS) | platform == set(Termination)  # a new termination must be placed here


@pytest.mark.parametrize("termination", AGENTS, ids=lambda t: t.value)
def test_what_the_agent_caused_is_scored(termination: Termination) -> None:
    assert exclusion(rollout(termination, ZERO)) is None


@pytest.mark.parametrize(
    "termination", [Termination.INFRA_ERROR, Termination.SANDBOX_ERROR], ids=lambda t: t.value
)
def test_what_the_platform_caused_is_left_out_and_named(termination: Termination) -> None:
    assert exclusion(rollout(termination, None, error="server unreachable")) == termination.value
    assert exclusion(rollout(termination, ZERO)) == termination.value  # even with a reward on it


def test_a_state_the_agent_broke_is_its_zero_and_counts() -> None:
    assert exclusion(rollout(Termination.ANSWERED, ZERO, ScoreFailure.AGENT_STATE)) is None


@pytest.mark.parametrize(
    "failure",
    [f for f in ScoreFailure if f is not ScoreFailure.AGENT_STATE],
    ids=lambda f: f.value,
)
def test_what_the_verifier_or_judge_caused_is_left_out_and_named(failure: ScoreFailure) -> None:
    assert exclusion(rollout(Termination.ANSWERED, None, failure)) == failure.value


def test_a_retried_attempt_is_left_out_whatever_it_holds() -> None:
    assert exclusion(rollout(Termination.ANSWERED, ZERO, retried=True)) == "retried"
    assert exclusion(rollout(Termination.INFRA_ERROR, None, retried=True)) == "retried"


def test_a_reply_the_record_could_not_hold_is_the_agents_parse_error() -> None:
    action = parse_action(f'{OPEN}{{"name": "calc", "arguments": {{"x": NaN}}}}{CLOSE}')
    assert action.tool_calls == () and action.parse_errors and not action.is_final
