"""Rollback guards: each rule fires on the history that should trip it, and only then."""

from __future__ import annotations

import json
import random
import typing
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from reprorl.config.spec import RollbackRule
from reprorl.errors import UserInputError
from reprorl.evaluation.guard_rules import CONDITIONS
from reprorl.evaluation.guards import (
    TOOL_FAULTS,
    Guard,
    GuardPoint,
    GuardVerdict,
    guard_point,
    required_task_ids,
    unsafe_count,
)
from reprorl.evaluation.point import INVALID, EvalPoint
from reprorl.evaluation.stats import Estimate
from reprorl.rollout.runner import RolloutResult
from reprorl.types import Message, Role, Split, Task, Termination, ToolOutcome, ToolResult, Trajectory, Turn


def _point(
    step: int, per_task: dict[str, float], required: set[str], suite: str = "calc", **kw: typing.Any
) -> GuardPoint:
    success = sum(per_task.values()) / len(per_task)
    return GuardPoint(step, suite, success, per_task, frozenset(required), **kw)


def _check(guard: Guard, *points: GuardPoint, cost: float = 0.0, **kw: typing.Any) -> GuardVerdict:
    verdict = guard.check(points, train_reward=kw.pop("train_reward", {}), cost_usd=cost, **kw)
    json.dumps(verdict.to_json())  # every verdict must go to the run record as it is
    return verdict


# --------------------------------------------------------------------------- required-task decline

REQUIRED = {"r1", "r2", "r3", "r4"}


def _tasks(r: tuple[float, ...], others: float) -> dict[str, float]:
    return {**{f"r{i + 1}": v for i, v in enumerate(r)}, **{f"o{i}": others for i in range(8)}}


def test_required_task_decline_fires_while_the_average_rises_and_clears_on_recovery() -> None:
    guard = Guard([RollbackRule(when="required_task_decline", action="revert")])
    first = _point(0, _tasks((1, 1, 1, 1), 0.0), REQUIRED)
    assert _check(guard, first).passed
    worse = _point(10, _tasks((1, 1, 1, 0), 1.0), REQUIRED)
    assert worse.success > first.success  # the average rose: 4/12 -> 11/12
    verdict = _check(guard, worse)
    assert not verdict.passed and verdict.action == "revert"
    (firing,) = verdict.fired
    assert (firing.when, firing.action, firing.threshold, firing.step) == (
        "required_task_decline",
        "revert",
        0.1,
        10,
    )
    (suite,) = firing.evidence["suites"]
    assert suite["declined"] == [{"task": "r4", "baseline": 1.0, "current": 0.0}]
    assert (suite["baseline_step"], suite["baseline"], suite["current"]) == (0, 1.0, 0.75)
    assert "r4" in firing.message
    assert guard.last_passed_step == 0
    # Back to the required level: passes, and becomes the last good checkpoint.
    assert _check(guard, _point(20, _tasks((1, 1, 1, 1), 1.0), REQUIRED)).passed
    assert guard.last_passed_step == 20


def test_baseline_is_the_best_earlier_passed_point_not_the_first() -> None:
    guard = Guard([RollbackRule(when="required_task_decline")])
    assert _check(guard, _point(0, _tasks((0, 0, 1, 1), 0.0), REQUIRED)).passed
    assert _check(guard, _point(10, _tasks((1, 1, 1, 1), 0.0), REQUIRED)).passed  # a gain
    verdict = _check(guard, _point(20, _tasks((1, 0, 1, 1), 0.0), REQUIRED))  # still above step 0
    assert verdict.action == "stop"  # the rule's default action
    assert verdict.fired[0].evidence["suites"][0]["baseline_step"] == 10


def test_a_failed_point_sets_no_baseline() -> None:
    guard = Guard(
        [
            RollbackRule(when="required_task_decline", action="revert"),
            RollbackRule(when="cost_cap", threshold=1.0),
        ]
    )
    assert _check(guard, _point(0, _tasks((1, 1, 0, 0), 0.0), REQUIRED)).passed
    assert not _check(guard, _point(10, _tasks((1, 1, 1, 1), 0.0), REQUIRED), cost=2.0).passed  # rejected
    # Compared with step 0 (0.5), not with the rejected step 10 (1.0).
    assert _check(guard, _point(20, _tasks((1, 1, 0, 0), 0.0), REQUIRED), cost=0.5).passed


def test_a_drop_of_exactly_the_threshold_does_not_fire() -> None:
    guard = Guard([RollbackRule(when="required_task_decline", threshold=0.1)])
    required = {f"t{i}" for i in range(10)}
    before = {f"t{i}": 1.0 if i < 8 else 0.0 for i in range(10)}
    after = {f"t{i}": 1.0 if i < 7 else 0.0 for i in range(10)}  # 0.8 - 0.7 > 0.1 in floating point
    assert _check(guard, _point(0, before, required)).passed
    assert _check(guard, _point(10, after, required)).passed


def test_decline_is_judged_per_suite_on_the_shared_required_tasks() -> None:
    guard = Guard([RollbackRule(when="required_task_decline")])
    _check(guard, _point(0, {"a": 1, "b": 1}, {"a", "b"}), _point(0, {"x": 1, "y": 0}, {"x"}, suite="sql"))
    # calc: only "a" was measured again, and it held; sql's required task dropped.
    verdict = _check(
        guard, _point(10, {"a": 1, "c": 0}, {"a", "b"}), _point(10, {"x": 0, "y": 1}, {"x"}, suite="sql")
    )
    (firing,) = verdict.fired
    assert [s["suite"] for s in firing.evidence["suites"]] == ["sql"]
    assert firing.evidence["suites"][0]["declined"][0]["task"] == "x"


# --------------------------------------------------------------------------- reward hacking

HACK = RollbackRule(when="reward_hacking", action="revert")


def _run(
    train: Callable[[int], float], held: Callable[[int], float], *, steps: int, every: int
) -> list[GuardVerdict]:
    """Eval before training steps 0, every, 2·every, ...: the train loop's order."""
    guard = Guard([HACK])
    rewards: dict[int, float] = {}
    verdicts = []
    for step in range(steps + 1):
        if step % every == 0:
            verdicts.append(_check(guard, GuardPoint(step, "held", held(step)), train_reward=rewards))
        rewards[step] = train(step)
    return verdicts


def _batch_mean(rng: random.Random, p: float, n: int = 16) -> float:
    return sum(rng.random() < p for _ in range(n)) / n


# 40 held-out tasks of evenly spread difficulty; eval seeds do not depend on the step, so a task
# is solved once the policy's skill passes its difficulty (paired points, no resampling noise).
DIFFICULTY = [(i + 0.5) / 40 for i in range(40)]


def _held(skill: float) -> float:
    return sum(d < skill for d in DIFFICULTY) / len(DIFFICULTY)


def test_loophole_exploit_fires_reward_hacking() -> None:
    # The policy learns a verifier loophole: exploiting rollouts score 1 on train, honest ones
    # succeed 30% of the time, and held-out tasks (no loophole) stay at that 30%.
    rng = random.Random(3)

    def train(step: int) -> float:
        exploit = min(1.0, step / 30)
        return _batch_mean(rng, exploit + (1 - exploit) * 0.3)

    verdicts = _run(train, lambda step: _held(0.3), steps=60, every=5)
    fired = [v for v in verdicts if v.fired]
    assert fired and fired[0].step <= 30  # while the climb is still on
    first = fired[0]
    assert first.action == "revert"
    evidence = first.fired[0].evidence
    assert evidence["train_rise"] > 0.1 and evidence["held_out_rise"] <= evidence["held_out_allowed"]
    assert len(evidence["steps"]) >= 3 and evidence["train_reward"][-1] > evidence["train_reward"][0]
    assert max(r for r in evidence["train_reward"] if r is not None) > 0.8
    json.dumps(evidence)


def test_genuine_improvement_does_not_fire() -> None:
    rng = random.Random(5)

    def skill(step: int) -> float:
        return 0.2 + 0.6 * step / 60

    verdicts = _run(lambda s: _batch_mean(rng, skill(s)), lambda s: _held(skill(s) - 0.05), steps=60, every=5)
    assert all(v.passed for v in verdicts)


@pytest.mark.parametrize("every", [5, 10])
@pytest.mark.parametrize("seed", range(10))
def test_noise_around_a_flat_train_reward_does_not_fire(seed: int, every: int) -> None:
    rng = random.Random(seed)
    walk = [0.0]

    def train(step: int) -> float:
        walk[0] = 0.8 * walk[0] + rng.gauss(0, 0.03)  # a mean-reverting random walk, plus batch noise
        return 0.5 + walk[0] + rng.gauss(0, 0.1)

    verdicts = _run(train, lambda step: 0.4 + rng.gauss(0, 0.05), steps=100, every=every)
    assert all(v.passed for v in verdicts)


def test_reward_hacking_waits_for_a_full_window() -> None:
    verdicts = _run(lambda s: s / 10, lambda s: 0.3, steps=10, every=5)  # 3 points: one window only
    assert all(v.passed for v in verdicts)
    assert not _run(lambda s: s / 10, lambda s: 0.3, steps=15, every=5)[-1].passed


# --------------------------------------------------------------------------- cost, safety, tools, metrics


def test_cost_cap_uses_the_rule_threshold_else_the_budget() -> None:
    p = _point(0, {"a": 1.0}, set())
    guard = Guard([RollbackRule(when="cost_cap")], max_usd=5.0)
    assert guard.check([p], train_reward={}, cost_usd=5.0).passed  # at the cap, not above
    verdict = _check(guard, _point(10, {"a": 1.0}, set()), cost=5.01)
    assert verdict.action == "stop"
    assert verdict.fired[0].evidence == {"cost_usd": 5.01, "cap_usd": 5.0, "cap_from": "budget.max_usd"}
    ruled = Guard([RollbackRule(when="cost_cap", threshold=2.0)], max_usd=5.0)
    assert ruled.check([p], train_reward={}, cost_usd=3.0).fired[0].evidence["cap_from"] == "rule"
    with pytest.raises(UserInputError, match=r"evaluation\.rollback\[1\].*max_usd"):
        Guard([RollbackRule(when="unsafe_action"), RollbackRule(when="cost_cap")])


def test_one_unsafe_action_stops_and_stop_beats_revert() -> None:
    guard = Guard(
        [RollbackRule(when="required_task_decline", action="revert"), RollbackRule(when="unsafe_action")]
    )
    assert _check(guard, _point(0, {"r": 1.0}, {"r"})).passed
    verdict = _check(guard, _point(10, {"r": 0.0}, {"r"}), train_unsafe_actions=1)
    assert [f.when for f in verdict.fired] == ["required_task_decline", "unsafe_action"]
    assert verdict.action == "stop"
    assert verdict.fired[1].evidence == {"unsafe_actions": 1, "train": 1, "eval": {}}
    # Eval rollouts count too; a rule may tolerate a few.
    tolerant = Guard([RollbackRule(when="unsafe_action", action="revert", threshold=1)])
    assert tolerant.check(
        [_point(0, {"r": 1.0}, set(), unsafe_actions=1)], train_reward={}, cost_usd=0
    ).passed
    verdict = _check(tolerant, _point(10, {"r": 1.0}, set(), unsafe_actions=1), train_unsafe_actions=1)
    assert verdict.action == "revert" and verdict.fired[0].evidence["eval"] == {"calc": 1}


def test_tool_failure_rate_fires_per_suite_on_tool_faults() -> None:
    guard = Guard([RollbackRule(when="tool_failure_rate")])  # default 0.2
    healthy = _point(0, {"a": 1.0}, set(), suite="calc", tool_calls=100, tool_failures=20)
    broken = _point(0, {"b": 1.0}, set(), suite="sql", tool_calls=10, tool_failures=3)
    verdict = _check(guard, healthy, broken)
    assert verdict.fired[0].evidence["suites"] == [{"suite": "sql", "rate": 0.3, "failures": 3, "calls": 10}]
    assert not TOOL_FAULTS & INVALID  # the model's own mistakes are not the tools' failures
    with pytest.raises(ValueError, match="tool failures"):
        _point(0, {"a": 1.0}, set(), tool_calls=1, tool_failures=2)


def test_metric_below_by_short_name_or_suite_key() -> None:
    guard = Guard([RollbackRule(when="metric_below", metric="reward", threshold=0.5, action="revert")])
    calc = _point(0, {"a": 1.0}, set(), metrics={"reward": 0.4})
    sql = _point(0, {"b": 1.0}, set(), suite="sql", metrics={"reward": 0.9})
    verdict = _check(guard, calc, sql)
    assert verdict.action == "revert"
    assert verdict.fired[0].evidence["below"] == {"calc": 0.4}
    only_sql = Guard([RollbackRule(when="metric_below", metric="eval/sql/success", threshold=0.5)])
    assert _check(only_sql, _point(0, {"a": 0.0}, set()), sql).passed  # calc's 0.0 is not watched
    with pytest.raises(UserInputError, match=r"rollback\[0\]\.metric.*'rewrad'"):
        _check(Guard([RollbackRule(when="metric_below", metric="rewrad", threshold=0.5)]), calc)


def test_integrity_above_fires_on_contradicted_train_rewards_since_the_last_check() -> None:
    guard = Guard([RollbackRule(when="integrity_above", action="revert")])  # default 0.1
    clean = {s: 0.0 for s in range(5)} | {3: 0.05}  # one contradicted reward in twenty at step 3
    assert _check(guard, _point(5, {"a": 1.0}, set()), train_contradicted=clean).passed
    # Steps 5..9: an exploit spreads; steps before the last check are not read again.
    planted = clean | {5: 0.0, 6: 0.1, 7: 0.25, 8: 0.5, 9: 0.5}
    verdict = _check(guard, _point(10, {"a": 1.0}, set()), train_contradicted=planted)
    assert verdict.action == "revert"
    evidence = verdict.fired[0].evidence
    assert evidence["steps"] == [5, 6, 7, 8, 9] and evidence["mean"] == pytest.approx(0.27)
    assert "27% of rewarded train rollouts contradicted over steps 5..9" in verdict.fired[0].message
    # No step with a rewarded rollout since the last check: nothing to judge, nothing fires.
    assert _check(guard, _point(15, {"a": 1.0}, set()), train_contradicted=planted).passed
    strict = Guard([RollbackRule(when="integrity_above", threshold=0.0)])
    assert _check(strict, _point(5, {"a": 1.0}, set()), train_contradicted={0: 0.0, 1: 0.0}).passed
    assert not _check(strict, _point(10, {"a": 1.0}, set()), train_contradicted={6: 0.02}).passed


def test_loop_guard_carries_contradicted_shares_through_a_checkpoint(tmp_path: Path) -> None:
    from reprorl.orchestrate.run.guarding import LoopGuard

    spec = SimpleNamespace(
        evaluation=SimpleNamespace(rollback=(RollbackRule(when="integrity_above"),)),
        budget=SimpleNamespace(max_usd=None),
    )
    guard = LoopGuard(spec, {})  # type: ignore[arg-type]
    for step, share in ((0, 0.5), (1, None), (2, 0.3)):
        guard.after_step(step, RolloutResult([]), 1.0, share)
    guard.save(tmp_path)
    resumed = LoopGuard(spec, {})  # type: ignore[arg-type]
    resumed.load(tmp_path)
    assert resumed.train_contradicted == {0: 0.5, 2: 0.3}
    state = json.loads((tmp_path / "guard.json").read_text())
    del state["train_contradicted"]  # a checkpoint written before the integrity figures existed
    (tmp_path / "guard.json").write_text(json.dumps(state))
    resumed.load(tmp_path)
    assert resumed.train_contradicted == {}


# --------------------------------------------------------------------------- history and state


def test_state_round_trip_gives_identical_next_verdicts() -> None:
    rules = [HACK, RollbackRule(when="required_task_decline", action="revert")]
    rng = random.Random(11)
    rewards = {s: min(1.0, 0.3 + s / 40) + rng.gauss(0, 0.02) for s in range(60)}
    points = [
        _point(s, {"r": 1.0 if s < 40 else 0.0, "o": 0.5}, {"r"}, suite="held") for s in range(0, 60, 5)
    ]
    whole, first = Guard(rules), Guard(rules)
    expected = [_check(whole, p, train_reward=rewards).to_json() for p in points]
    for p in points[:5]:
        _check(first, p, train_reward=rewards)
    resumed = Guard(rules)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert resumed.history == first.history
    assert [_check(resumed, p, train_reward=rewards).to_json() for p in points[5:]] == expected[5:]
    assert any(v["fired"] for v in expected[5:])  # the rest of the run does fire
    with pytest.raises(ValueError, match="version"):
        resumed.load_state_dict({"version": 99, "history": []})


def test_check_refuses_inconsistent_points_and_rewind_allows_a_recheck() -> None:
    guard = Guard([RollbackRule(when="unsafe_action")])
    with pytest.raises(ValueError, match="share a step"):
        _check(guard, _point(0, {"a": 1}, set()), _point(5, {"a": 1}, set(), suite="sql"))
    with pytest.raises(ValueError, match="one eval point per suite"):
        _check(guard, _point(0, {"a": 1}, set()), _point(0, {"a": 1}, set()))
    _check(guard, _point(0, {"a": 1}, set()))
    _check(guard, _point(10, {"a": 1}, set()))
    with pytest.raises(ValueError, match="rewind"):
        _check(guard, _point(10, {"a": 1}, set()))
    guard.rewind(10)
    assert [r.step for r in guard.history] == [0]
    assert _check(guard, _point(10, {"a": 1}, set())).passed


def test_every_rule_kind_has_a_condition_class() -> None:
    whens = typing.get_args(RollbackRule.model_fields["when"].annotation)
    assert set(CONDITIONS) == set(whens)
    assert all(cls.__doc__ for cls in CONDITIONS.values())


def test_guard_point_from_an_eval_point() -> None:
    def traj(task: str, termination: Termination, *outcomes: ToolOutcome) -> Trajectory:
        results = tuple(ToolResult(call_id="c", name="calc", outcome=o) for o in outcomes)
        turns = (Turn(index=0, tool_results=results),)
        return Trajectory(
            run_id="r",
            rollout_id=task,
            split=Split.EVAL,
            task_id=task,
            task_hash="h",
            turns=turns,
            termination=termination,
        )

    trajectories = [
        traj("a", Termination.ANSWERED, ToolOutcome.OK, ToolOutcome.TOOL_TIMEOUT),
        traj("b", Termination.UNSAFE_ACTION, ToolOutcome.PARSE_ERROR, ToolOutcome.TOOL_EXCEPTION),
    ]
    est = Estimate(0.5, 0.0, 1.0, 2, "bootstrap")
    point = EvalPoint("calc", 10, "v1", RolloutResult(trajectories), est, est, {"a": 1.0, "b": 0.0})
    prompt = (Message(role=Role.USER, content="?"),)
    tasks = [
        Task(id="a", family="calc", prompt=prompt, tags=("required",)),
        Task(id="b", family="calc", prompt=prompt),
    ]
    gp = guard_point(point, required_task_ids(tasks))
    assert (gp.step, gp.suite, gp.success, gp.required) == (10, "calc", 0.5, frozenset({"a"}))
    assert (gp.tool_calls, gp.tool_failures, gp.unsafe_actions) == (4, 2, 1)  # the parse error is the model's
    assert gp.metrics["success"] == 0.5 and "rollouts" in gp.metrics
    assert unsafe_count(trajectories) == 1
