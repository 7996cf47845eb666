"""A judge's score joining a rollout's reward: weighed into the total, named in the version, its cost
added; a failed judgement leaves the rollout unscored; damage earns nothing and asks the judge nothing."""

from __future__ import annotations

import asyncio

import pytest

from reprorl.rewards.base import compose
from reprorl.rollout.judging import JUDGE, Judgement, judged, with_judgement
from reprorl.types import Message, Role, Split, Task, Termination, Trajectory

WEIGHTS = {"outcome": 1.0, JUDGE: 0.5}
TASK = Task(id="t", family="calculator", prompt=(Message(role=Role.USER, content="2+2?"),))


class Judge:
    """Answers with a fixed judgement and counts what it was asked."""

    judge_id = "m@abc"

    def __init__(self, judgement: Judgement) -> None:
        self.judgement, self.asked = judgement, 0

    async def judge(self, task: Task, trajectory: Trajectory) -> Judgement:
        self.asked += 1
        return self.judgement

    def close(self) -> None:
        pass


def rollout(termination: Termination = Termination.ANSWERED, *, scored: bool = True) -> Trajectory:
    reward = compose({"outcome": 1.0}, WEIGHTS, "calc@1") if scored else None
    return Trajectory(
        run_id="r", rollout_id="r/0", split=Split.TRAIN, task_id="t", task_hash="h", termination=termination,
        reward=reward, cost_usd=0.25,
    )  # fmt: skip


def test_a_score_is_weighed_named_and_paid_for() -> None:
    out = with_judgement(rollout(), Judgement(0.6, cost_usd=0.01), WEIGHTS, "m@abc")
    assert out.reward is not None
    assert out.reward.components == {"outcome": 1.0, JUDGE: 0.6}
    assert out.reward.total == pytest.approx(1.0 + 0.5 * 0.6)
    assert out.reward.verifier_version == "calc@1+judge:m@abc"
    assert out.cost_usd == pytest.approx(0.26) and out.error is None


def test_a_failed_judgement_leaves_the_rollout_unscored_and_says_why() -> None:
    out = with_judgement(rollout(), Judgement(None, "infra_error: timed out", 0.0), WEIGHTS, "m@abc")
    assert out.reward is None and out.error == "judge m@abc failed: infra_error: timed out"
    assert out.termination is Termination.ANSWERED  # the agent's episode ended as it did


def test_damage_earns_no_judge_credit_and_unscored_rollouts_are_not_judged() -> None:
    judge = Judge(Judgement(1.0))
    unsafe = asyncio.run(judged(judge, TASK, rollout(Termination.UNSAFE_ACTION), WEIGHTS))
    assert unsafe.reward is not None and unsafe.reward.components[JUDGE] == 0.0 and judge.asked == 0
    unscored = rollout(Termination.INFRA_ERROR, scored=False)
    assert asyncio.run(judged(judge, TASK, unscored, WEIGHTS)) is unscored and judge.asked == 0
    answered = asyncio.run(judged(judge, TASK, rollout(), WEIGHTS))
    assert answered.reward is not None and answered.reward.components[JUDGE] == 1.0 and judge.asked == 1
