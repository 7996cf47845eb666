"""`env-reported`: an external env's own rewards scored, and never a missing or non-finite one as 0."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from reprorl.envs.external.openenv_env import _reward
from reprorl.envs.external.openenv_server import ExternalEnvError, OpenEnvServerSpec
from reprorl.errors import UserInputError
from reprorl.rewards import FinalState
from reprorl.rewards.verifiers.reported import EnvReported
from reprorl.types import Message, Role, Task, Termination

TASK = Task(id="t", family="f", prompt=(Message(role=Role.USER, content="go"),))


def state(reported: dict[str, float] | None) -> FinalState:
    return FinalState("42", Path("/nonexistent"), Termination.ENV_DONE, reported)


def test_the_return_or_the_last_reward_is_the_outcome_clipped_to_the_unit_interval() -> None:
    report = {"return": 2.5, "last": 0.25, "steps": 3.0, "done": 1.0}
    assert EnvReported().score(TASK, state(report)) == {"outcome": 1.0, "env/done": 1.0}
    assert EnvReported(outcome="last").score(TASK, state(report)) == {"outcome": 0.25, "env/done": 1.0}
    assert EnvReported().score(TASK, state({**report, "return": -1.0, "done": 0.0}))["outcome"] == 0.0


@pytest.mark.parametrize("report", [None, {"return": math.nan}, {"return": math.inf}, {"last": 1.0}])
def test_no_report_or_a_non_finite_one_fails_to_score(report: dict[str, float] | None) -> None:
    with pytest.raises(ValueError):
        EnvReported().score(TASK, state(report))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "1e400", "lots"])
def test_a_step_reward_that_is_not_a_finite_number_is_the_servers_failure(value: object) -> None:
    with pytest.raises(ExternalEnvError):
        _reward(value)
    assert _reward(None) == 0.0 and _reward(True) == 1.0 and _reward("0.5") == 0.5


def test_a_server_spec_needs_one_source_and_a_port_placeholder() -> None:
    with pytest.raises(UserInputError, match="exactly one"):
        OpenEnvServerSpec()
    with pytest.raises(UserInputError, match="exactly one"):
        OpenEnvServerSpec(command=("serve", "{port}"), url="http://127.0.0.1:1")
    with pytest.raises(UserInputError, match="port"):
        OpenEnvServerSpec(command=("serve", "--port", "8000"))
