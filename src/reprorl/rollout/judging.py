"""Judged rewards: an outside judge's score joining a rollout's reward as the weighted component `judge`.

The judge reads the finished rollout (its transcript and final answer), so it scores after the
verifier, outside the sandbox. A judgement that fails (the server is down, the reply unreadable)
leaves the rollout unscored, as a verifier that fails does: the verifier's total without the judge
would be a different reward than the run declared, and a zero would blame the agent for an outage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from reprorl.rewards.base import compose
from reprorl.types import ScoreFailure, Task, Termination, Trajectory

JUDGE = "judge"
JUDGED_BY = "+judge:"


@dataclass(frozen=True)
class Judgement:
    """One judge's verdict on one rollout: a score in [0, 1], or why there is none."""

    score: float | None
    failure: str | None = None
    cost_usd: float = 0.0


class RewardJudge(Protocol):
    """What the runner needs of a judge; `reprorl.orchestrate.run.judge_reward` makes one from the spec."""

    judge_id: str

    async def judge(self, task: Task, trajectory: Trajectory) -> Judgement: ...

    def close(self) -> None: ...


async def judged(
    judge: RewardJudge, task: Task, trajectory: Trajectory, weights: Mapping[str, float] | None
) -> Trajectory:
    """`trajectory` scored by `judge` too; one with no reward (unscored, an infra failure) is kept as is."""
    if trajectory.reward is None:
        return trajectory
    if trajectory.termination is Termination.UNSAFE_ACTION:
        judgement = Judgement(0.0)  # no credit for damage from any scorer, so the judge is not asked
    else:
        judgement = await judge.judge(task, trajectory)
    return with_judgement(trajectory, judgement, weights or {"outcome": 1.0}, judge.judge_id)


def with_judgement(
    trajectory: Trajectory, judgement: Judgement, weights: Mapping[str, float], judge_id: str
) -> Trajectory:
    """The rollout with the judge's score among its reward components and in its total.

    The reward's `verifier_version` gains `+judge:<judge id>`, so every stored total names all that
    produced it; the judge's cost is added to the rollout's.
    """
    reward = trajectory.reward
    cost = trajectory.cost_usd + judgement.cost_usd
    if reward is None:
        return trajectory
    if judgement.score is None:
        error = f"judge {judge_id} failed: {judgement.failure or 'no score'}"
        update = {"reward": None, "error": error, "cost_usd": cost, "score_failure": ScoreFailure.JUDGE_ERROR}
        return trajectory.model_copy(update=update)
    components = {**reward.components, JUDGE: judgement.score}
    version = f"{reward.verifier_version}{JUDGED_BY}{judge_id}"
    judged = compose(components, dict(weights), version)
    return trajectory.model_copy(update={"reward": judged, "cost_usd": cost})
