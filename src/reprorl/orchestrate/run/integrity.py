"""Run-time reward integrity: how many of a step's rewards a cross verifier or a signature contradicts.

Three figures per step, each logged only when it is defined:

- `integrity/contradicted`: of the rewarded rollouts (outcome success) that something could check,
  the share that a cross verifier failed (`cross/<class>` = 0.0) or whose final answer matches a
  probe-like signature;
- `integrity/cross_disagree`: of the scored rollouts with cross verdicts, the share where a cross
  verifier's pass or fail differs from the primary's success, either way;
- `integrity/signature`: of the rollouts whose task is known, the share whose final answer matches
  a signature, rewarded or not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from reprorl.evaluation.judge import final_answer
from reprorl.rewards.audit import signature
from reprorl.rollout.episode import CROSS
from reprorl.types import Reward, Task, Trajectory

CONTRADICTED, CROSS_DISAGREE, SIGNATURE = (
    "integrity/contradicted",
    "integrity/cross_disagree",
    "integrity/signature",
)


def cross_verdicts(reward: Reward | None) -> dict[str, bool]:
    """Each cross verifier's pass (True) or fail, from the reward's `cross/<class>` components."""
    if reward is None:
        return {}
    return {k: v >= 1.0 for k, v in reward.components.items() if k.startswith(CROSS)}


def answer_text(trajectory: Trajectory) -> str | None:
    """The final answer's text; None when every turn was a tool call (the agent never answered)."""
    answered = any(turn.finish_reason != "tool_call" for turn in trajectory.turns)
    return final_answer(trajectory) if answered else None


def trajectory_signature(task: Task, trajectory: Trajectory) -> str | None:
    calls = sum(len(turn.tool_calls) for turn in trajectory.turns)
    return signature(task, answer_text(trajectory), calls)


def integrity_metrics(trajectories: Sequence[Trajectory], tasks: Iterable[Task] = ()) -> dict[str, float]:
    """The step's integrity figures over its final rollouts; `tasks` are the ones they may have run."""
    by_id = {t.id: t for t in tasks}
    rewarded = contradicted = crossed = disagree = known = signed = 0
    for trajectory in trajectories:
        task = by_id.get(trajectory.task_id)
        if task is not None and task.content_hash != trajectory.task_hash:
            task = None  # another task under the same id: its reference would judge the wrong answer
        matched = task is not None and trajectory_signature(task, trajectory) is not None
        known += task is not None
        signed += matched
        reward = trajectory.reward
        verdicts = cross_verdicts(reward)
        if reward is None:
            continue
        if verdicts:
            crossed += 1
            disagree += any(v != reward.success for v in verdicts.values())
        if reward.success and (verdicts or task is not None):
            rewarded += 1
            contradicted += matched or not all(verdicts.values())
    figures: dict[str, float] = {}
    if rewarded:
        figures[CONTRADICTED] = contradicted / rewarded
    if crossed:
        figures[CROSS_DISAGREE] = disagree / crossed
    if known:
        figures[SIGNATURE] = signed / known
    return figures
