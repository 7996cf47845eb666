"""In-loop screening: group verdicts, which tasks rest when, the draw around them, and the spec's rules."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from reprorl.config import RunSpec
from reprorl.orchestrate.run.rollouts import step_tasks
from reprorl.orchestrate.run.signal_pool import EVENT, SignalPool, group_verdicts
from reprorl.types import Message, Reward, ScoreFailure, Task, Trajectory
from rollout_records import make

OWNER = "t@example.com"


def _spec(screen: dict[str, int] | None = None, per_step: int = 3, **pipeline: object) -> RunSpec:
    data: dict[str, object] = {"owner": OWNER, "train": "t@sha256:" + "0" * 64}
    if screen is not None:
        data["screen"] = screen
    return RunSpec.model_validate(
        {
            "seed": 5,
            "model": {"owner": OWNER, "base": "m@sha256:" + "0" * 64},
            "data": data,
            "learning": {"owner": OWNER, "tasks_per_step": per_step, "pipeline": pipeline},
            "evaluation": {"owner": OWNER, "suites": ["e@sha256:" + "1" * 64]},
        }
    )


def _tasks(n: int) -> list[Task]:
    return [Task(id=f"t-{i}", family="calc", prompt=(Message(role="user", content="q"),)) for i in range(n)]


def _member(task: str, total: float, success: bool, failure: ScoreFailure | None = None) -> Trajectory:
    outcome = 1.0 if success else 0.0
    reward = Reward(total=total, components={"outcome": outcome}, verifier_version="sha256:v1")
    update = {"task_id": task, "reward": None if failure else reward, "score_failure": failure}
    return make(0, "answered").model_copy(update=update)


def test_a_group_s_verdict_is_signal_too_easy_or_no_signal_over_its_counted_members() -> None:
    trajectories = [
        _member("mixed", 1.0, True),
        _member("mixed", 0.0, False),
        _member("easy", 1.0, True),
        _member("easy", 1.0, True),
        _member("hard", 0.0, False),
        _member("hard", 0.0, False),
        # Shaping can differ where success does not: the rewards still give an advantage.
        _member("shaped", 0.2, False),
        _member("shaped", 0.0, False),
        # A member the verifier failed is left out: one counted member is no verdict.
        _member("lonely", 1.0, True),
        _member("lonely", 0.0, False, failure=ScoreFailure.VERIFIER_ERROR),
    ]
    assert group_verdicts(trajectories) == {
        "easy": "too_easy",
        "hard": "no_signal",
        "mixed": "signal",
        "shaped": "signal",
    }


def test_a_task_without_signal_rests_its_steps_and_a_lagged_draw_sees_it_later() -> None:
    pool = SignalPool(rest_steps=3, lag=0)
    pool.observe(2, {"t-0": "no_signal", "t-1": "signal", "t-2": "too_easy"})
    assert pool.resting(2) == {}  # step 2 reads the steps before it
    assert pool.resting(3) == {"t-0": 5, "t-2": 5}
    assert pool.resting(4) == {"t-0": 5, "t-2": 5}
    assert pool.resting(5) == {}
    pool.observe(4, {"t-0": "signal"})  # a later verdict replaces the earlier one
    assert pool.resting(5) == {}
    lagged = SignalPool(rest_steps=3, lag=1, verdicts=dict(pool.verdicts))
    assert lagged.resting(3) == {}  # with staleness 1, step 3 may sample before step 2 is trained
    assert lagged.resting(4) == {"t-0": 5, "t-2": 5}


def test_the_draw_skips_resting_tasks_and_fills_a_shortfall_with_those_due_back_soonest() -> None:
    tasks, spec = _tasks(5), _spec({"rest_steps": 4})
    unscreened = step_tasks(tasks, spec, 7)
    assert step_tasks(tasks, spec, 7, {}) == unscreened  # nothing resting: the unscreened draw
    drawn = step_tasks(tasks, spec, 7, {"t-0": 9, "t-1": 9})
    assert sorted(t.id for t in drawn) == ["t-2", "t-3", "t-4"]
    drawn = step_tasks(tasks, spec, 7, {"t-0": 10, "t-1": 8, "t-2": 9, "t-3": 9})
    assert [t.id for t in drawn] == ["t-4", "t-1", "t-2"]  # t-4 ready; then due 8, then 9 (order)
    assert drawn == step_tasks(tasks, spec, 7, {"t-0": 10, "t-1": 8, "t-2": 9, "t-3": 9})


def test_replay_rebuilds_the_verdicts_before_the_resume_and_a_rerun_step_s_last_event_wins() -> None:
    events = [
        {"event": EVENT, "step": 0, "verdicts": {"t-0": "no_signal"}},
        {"event": EVENT, "step": 1, "verdicts": {"t-1": "no_signal"}},
        {"event": "resumed", "from_step": 1},
        {"event": EVENT, "step": 1, "verdicts": {"t-1": "signal"}},
        {"event": EVENT, "step": 2, "verdicts": {"t-2": "no_signal"}},
    ]
    pool = SignalPool(rest_steps=5, lag=0)
    pool.replay(events, before=2)
    assert pool.verdicts == {0: {"t-0": "no_signal"}, 1: {"t-1": "signal"}}
    assert pool.resting(2) == {"t-0": 5}


def test_screening_is_refused_in_arrival_order_and_left_out_of_the_dump_while_unset() -> None:
    with pytest.raises(ValidationError, match=re.escape("learning.pipeline.source = 'planned'")):
        _spec({"rest_steps": 2}, source="arrival", max_staleness=1)
    with pytest.raises(ValidationError, match="rest_steps"):
        _spec({"rest_steps": 0})
    # Fields added later leave earlier runs' spec documents (and hashes) as they were.
    assert {"screen", "family_weights"}.isdisjoint(_spec().model_dump(mode="json")["data"])
    assert _spec({"rest_steps": 2}).model_dump(mode="json")["data"]["screen"] == {"rest_steps": 2}
