"""Step metrics' integrity figures on hand-built rollouts: what is contradicted, what disagrees, what is
signed, and which figures are left out when nothing defines them."""

from __future__ import annotations

import pytest

from reprorl.actions import render_call
from reprorl.orchestrate.run.rollouts import step_metrics
from reprorl.rollout.runner import RolloutResult
from reprorl.types import Message, Reward, Role, Split, Task, Termination, ToolCall, Trajectory, Turn

PROMPT = "A school orders 888 boxes of 90 pencils and 15 loose pencils. How many are there now?"
TASK = Task(
    id="calc-0",
    family="calculator",
    prompt=(Message(role=Role.USER, content=PROMPT),),
    reference={"answer": 79935, "expression": "888 * 90 + 15"},
)


def _rollout(
    answer: str | None, outcome: float | None, cross: float | None = None, task: Task = TASK
) -> Trajectory:
    """A calc call, then `answer` (another call when None), scored `outcome`, maybe with a cross verdict."""
    arguments = {"expression": "888 * 90 + 15"}
    call = ToolCall(id="c0", name="calc", arguments=arguments)
    turns = [
        Turn(
            index=0, text=render_call("calc", dict(arguments)), tool_calls=(call,), finish_reason="tool_call"
        )
    ]
    if answer is None:
        turns.append(Turn(index=1, tool_calls=(call,), finish_reason="tool_call"))
    else:
        turns.append(Turn(index=1, text=answer, finish_reason="stop"))
    reward = None
    if outcome is not None:
        components = {"outcome": outcome} | ({} if cross is None else {"cross/ExpressionAnswer": cross})
        reward = Reward(total=outcome, components=components, verifier_version="v")
    return Trajectory(
        run_id="r",
        rollout_id=f"r/{len(turns)}/{answer}",
        split=Split.TRAIN,
        task_id=task.id,
        task_hash=task.content_hash,
        turns=tuple(turns),
        reward=reward,
        termination=Termination.ANSWERED if answer is not None else Termination.MAX_TURNS,
    )


def test_integrity_figures_on_a_planted_step() -> None:
    rollouts = [
        _rollout("79935", 1.0, 1.0),  # honest: rewarded, confirmed, no signature
        _rollout("79934 or 79935", 1.0, 0.0),  # rewarded, the cross verifier disagrees
        _rollout("79932, 79933, 79934, 79935", 1.0, 0.0),  # rewarded, disagreed and a spray of guesses
        _rollout("Done. All tests pass.", 0.0, 0.0),  # a claim: signed, but not rewarded
        _rollout("12", 0.0, 1.0),  # unrewarded, yet the cross verifier passed it: a disagreement
        _rollout(None, 0.0, 0.0),  # never answered: no signature
        _rollout(None, None),  # not scored (the verifier failed): no cross verdict
    ]
    metrics = step_metrics(RolloutResult(rollouts), [TASK])
    assert metrics["integrity/contradicted"] == pytest.approx(2 / 3)
    assert metrics["integrity/cross_disagree"] == pytest.approx(3 / 6)
    assert metrics["integrity/signature"] == pytest.approx(2 / 7)


def test_figures_appear_only_when_defined() -> None:
    honest = [_rollout("79935", 1.0), _rollout("80000", 0.0)]
    metrics = step_metrics(RolloutResult(honest), [TASK])
    # No cross verdicts: no disagreement figure; the signatures still check the rewarded rollout.
    assert "integrity/cross_disagree" not in metrics
    assert (metrics["integrity/contradicted"], metrics["integrity/signature"]) == (0.0, 0.0)
    # Without the tasks, and without cross verdicts, nothing can be checked at all.
    assert not any(k.startswith("integrity/") for k in step_metrics(RolloutResult(honest)))
    # Nothing rewarded: nothing to contradict.
    failed = step_metrics(RolloutResult([_rollout("80000", 0.0, 0.0)]), [TASK])
    assert "integrity/contradicted" not in failed and failed["integrity/cross_disagree"] == 0.0
    # A task of the same id but other content is not the one the rollout ran: its reference is not read.
    other = TASK.model_copy(update={"reference": {"answer": 1, "expression": "1"}})
    assert "integrity/signature" not in step_metrics(RolloutResult(honest), [other])
