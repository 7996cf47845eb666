"""Eval metrics on hand-built rollouts: every figure against an answer worked out by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

import pytest

from reprorl.evaluation.metrics import FAILURE_CLASSES, per_task_mean, success, task_interval
from reprorl.evaluation.point import EvalPoint, evaluate
from reprorl.evaluation.stats import Estimate, proportion_ci
from reprorl.rollout.runner import RolloutJob, RolloutResult, RolloutRunner
from reprorl.types import (
    Message,
    Reward,
    Role,
    SamplingParams,
    Split,
    Task,
    Termination,
    ToolCall,
    ToolOutcome,
    ToolResult,
    Trajectory,
    Turn,
)

PROMPT = (Message(role=Role.USER, content="?"),)
OK, TIMEOUT = ToolOutcome.OK, ToolOutcome.TOOL_TIMEOUT
T_975_DF1 = 12.706204736174698  # Student t, 97.5% quantile, 1 degree of freedom


def task(task_id: str, family: str = "calc", reference_steps: int | None = None) -> Task:
    return Task(id=task_id, family=family, prompt=PROMPT, reference_steps=reference_steps)


def call(name: str, outcome: ToolOutcome = OK) -> tuple[str, ToolOutcome]:
    return (name, outcome)


def traj(
    task_id: str,
    *steps: Sequence[tuple[str, ToolOutcome]],
    outcome: float | None = 1.0,
    total: float | None = None,
    termination: Termination = Termination.ANSWERED,
    wall_s: float = 0.0,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    cost_usd: float = 0.0,
) -> Trajectory:
    """A rollout whose tool turns are `steps` (calls named "" are unparsed), then one answer turn."""
    turns = []
    for i, calls in enumerate(steps):
        parsed = tuple(ToolCall(id=f"c{i}.{j}", name=n) for j, (n, _) in enumerate(calls) if n)
        results = tuple(ToolResult(call_id=f"c{i}.{j}", name=n, outcome=o) for j, (n, o) in enumerate(calls))
        turns.append(Turn(index=i, tool_calls=parsed, tool_results=results))
    turns.append(Turn(index=len(steps), text="done"))
    reward = None
    if outcome is not None:
        components = {"outcome": outcome}
        reward = Reward(
            total=outcome if total is None else total, components=components, verifier_version="v"
        )
    return Trajectory(
        run_id="r",
        rollout_id=f"{task_id}/{len(steps)}/{wall_s}",
        split=Split.EVAL,
        task_id=task_id,
        task_hash="h",
        turns=tuple(turns),
        reward=reward,
        termination=termination,
        wall_s=wall_s,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cost_usd=cost_usd,
    )


def point(trajectories: list[Trajectory], tasks: Sequence[Task] = (), seed: int = 0) -> EvalPoint:
    """An eval point built as `evaluate` builds one."""
    per_task = per_task_mean(trajectories, success)
    rewards = per_task_mean(trajectories, lambda t: t.reward.total if t.reward else 0.0)
    return EvalPoint(
        "s",
        3,
        "v1",
        RolloutResult(trajectories),
        task_interval(per_task, seed),
        task_interval(rewards, seed),
        per_task,
        tasks={t.id: t for t in tasks},
        seed=seed,
    )


def short(metrics: dict[str, float], suite: str = "s") -> dict[str, float]:
    return {k.removeprefix(f"eval/{suite}/"): v for k, v in metrics.items()}


# One family. t1 and t2 have reference solutions of one tool call, t3 has none.
ONE_FAMILY = [task("t1", reference_steps=1), task("t2", reference_steps=1), task("t3")]
ROLLOUTS = [
    # t1: the reference's single call, then the answer: 0 extra steps.
    traj("t1", [call("calc")], wall_s=1.0, prompt_tokens=100, completion_tokens=10, cost_usd=0.01),
    # t2: three tool turns (2 extra), one timeout, a human takeover; half the outcome, shaping on top.
    traj(
        "t2",
        [call("calc")],
        [call("calc", TIMEOUT)],
        [call("ask_human")],
        outcome=0.5,
        total=0.7,
        wall_s=2.0,
        prompt_tokens=200,
        completion_tokens=20,
        cost_usd=0.02,
    ),
    # t3: an unparsed call, two takeovers and a malformed ask_human (not a takeover); unsafe, so scored 0.
    traj(
        "t3",
        [call("", ToolOutcome.PARSE_ERROR)],
        [call("ask_human"), call("ask_human"), call("ask_human", ToolOutcome.BAD_ARGUMENTS)],
        outcome=0.0,
        termination=Termination.UNSAFE_ACTION,
        wall_s=3.0,
        prompt_tokens=300,
        completion_tokens=30,
        cost_usd=0.03,
    ),
    # t1 again: three calls where one would do (2 extra).
    traj("t1", [call("calc")], [call("calc")], [call("calc")], wall_s=10.0, prompt_tokens=400, cost_usd=0.04),
]


def test_single_family_figures_match_hand_computation() -> None:
    m = short(point(ROLLOUTS, ONE_FAMILY).metrics())
    assert (m["rollouts"], m["tasks"]) == (4.0, 3.0)
    # Success per task: t1 = 1, t2 = 0, t3 = 0. Partial credit per task: t1 = 1, t2 = 0.5, t3 = 0.
    assert m["success"] == pytest.approx(1 / 3)
    assert m["partial_credit"] == pytest.approx(0.5)
    assert m["partial_credit_low"] <= 0.5 <= m["partial_credit_high"]
    # Extra steps per task, over tasks with a reference: t1 = mean(0, 2) = 1, t2 = 2 → 1.5
    # (per episode it would be 4/3: tasks weigh equally, whatever their sample count).
    assert m["extra_steps"] == pytest.approx(1.5)
    assert (m["extra_steps_low"], m["extra_steps_high"]) == (1.0, 2.0)  # only two values to resample
    # Latency over wall_s = 1, 2, 3, 10: linear interpolation, p95 at rank 2.85 → 3 + 0.85·7.
    assert m["latency_mean"] == pytest.approx(4.0)
    assert m["latency_p50"] == pytest.approx(2.5)
    assert m["latency_p95"] == pytest.approx(8.95)
    assert (m["prompt_tokens_mean"], m["completion_tokens_mean"]) == (250.0, 15.0)
    # Takeovers: t2 one, t3 two (its malformed call reached no human) → 3/4 per episode, 2 of 4 episodes.
    assert (m["human_takeovers_mean"], m["human_takeover_share"]) == (0.75, 0.5)
    assert m["unsafe_actions"] == 1.0
    assert m["cost_usd"] == pytest.approx(0.10)
    # Calls: 10 parsed (the unparsed one is no call); results: 11, of which 1 timeout, 1 parse error,
    # 1 bad arguments (the last two are the model's: invalid).
    assert m["tool_calls_mean"] == 2.5
    assert m["invalid_calls_mean"] == 0.5
    assert m["tool_failure_rate_tool_timeout"] == pytest.approx(1 / 11)
    assert m["tool_failure_rate_parse_error"] == pytest.approx(1 / 11)
    assert m["tool_failure_rate_bad_arguments"] == pytest.approx(1 / 11)
    rates = {f"tool_failure_rate_{o.value}" for o in FAILURE_CLASSES}
    assert "tool_failure_rate_ok" not in m and rates <= m.keys()
    assert sum(m[k] for k in rates) == pytest.approx(3 / 11)


def test_a_single_family_suite_has_no_family_or_cluster_keys() -> None:
    m = point(ROLLOUTS, ONE_FAMILY).metrics()
    # The only deeper keys are the counts of rollouts left out, by class (`excluded/<class>`).
    assert all(k.startswith("eval/s/") and k.removeprefix("eval/s/excluded/").count("/") <= 2 for k in m)
    assert {k.count("/") for k in m if "/excluded/" not in k} == {2}
    assert not any("cluster" in k for k in m)


def test_stored_success_and_reward_are_reported_unchanged() -> None:
    # A point built by hand (as the guards' tests do): its stored estimates are the reported figures.
    est = Estimate(0.5, 0.1, 0.9, 2, "bootstrap")
    reward = Estimate(0.25, 0.0, 1.0, 2, "bootstrap")
    p = EvalPoint("calc", 10, "v1", RolloutResult(ROLLOUTS), est, reward, {"t1": 1.0, "t2": 0.0})
    m = short(p.metrics(), "calc")
    assert (m["success"], m["success_low"], m["success_high"], m["reward"]) == (0.5, 0.1, 0.9, 0.25)
    # Without its tasks the point knows no families and no reference steps.
    assert "extra_steps" not in m and not any("/" in k.removeprefix("excluded/") for k in m)


def test_extra_steps_are_absent_when_no_task_has_a_reference() -> None:
    m = short(point(ROLLOUTS, [task("t1"), task("t2"), task("t3")]).metrics())
    assert not any(k.startswith("extra_steps") for k in m)


def test_tool_free_rollouts_report_zero_failure_rates_not_nan() -> None:
    m = short(point([traj("t1"), traj("t2", outcome=0.0)], [task("t1"), task("t2")]).metrics())
    assert all(m[f"tool_failure_rate_{o.value}"] == 0.0 for o in FAILURE_CLASSES)
    assert m["tool_calls_mean"] == 0.0 and m["human_takeover_share"] == 0.0


TWO_FAMILIES = [task(f"c{i}", "calc", 1) for i in range(4)] + [task(f"q{i}", "sql", 2) for i in range(4)]
# Success per task: calc 1, 1, 0, 1 and sql 0, 0, 1, 0.
# Each rollout makes exactly its task's reference number of tool calls, one per turn.
MIXED = [
    traj(t.id, *([call("calc")] for _ in range(t.reference_steps or 0)), outcome=float(s), wall_s=w)
    for t, s, w in zip(TWO_FAMILIES, [1, 1, 0, 1, 0, 0, 1, 0], [1, 2, 3, 4, 10, 20, 30, 40], strict=True)
]


def test_multi_family_suites_report_each_family_and_a_cluster_interval() -> None:
    m = short(point(MIXED, TWO_FAMILIES, seed=11).metrics())
    assert m["success"] == 0.5
    assert (m["calc/success"], m["sql/success"]) == (0.75, 0.25)
    assert (m["calc/tasks"], m["sql/rollouts"]) == (4.0, 4.0)
    assert (m["calc/latency_p50"], m["sql/latency_p50"]) == (2.5, 25.0)
    assert (m["calc/extra_steps"], m["sql/extra_steps"]) == (0.0, 0.0)
    # Each family's figures are those of the family alone (its own bootstrap seed aside).
    alone = short(point(MIXED[4:], TWO_FAMILIES[4:]).metrics())
    for name in ("partial_credit", "latency_p95", "tool_calls_mean", "tool_failure_rate_tool_timeout"):
        assert m[f"sql/{name}"] == alone[name]
    # CR1 by hand: N = 8, mean 0.5; per-family sums of deviations +1 and -1;
    # SE² = G/(G-1) · Σ s_g² / N² = 2 · 2 / 64, so SE = 0.25; t on G - 1 = 1 df.
    half = T_975_DF1 * 0.25
    assert m["success_cluster_low"] == pytest.approx(0.5 - half)
    assert m["success_cluster_high"] == pytest.approx(0.5 + half)
    assert m["partial_credit_cluster_low"] == pytest.approx(0.5 - half)  # outcome = success here
    # Two families that differ this much leave one degree of freedom: far wider than the bootstrap.
    assert m["success_cluster_low"] < m["success_low"] and m["success_high"] < m["success_cluster_high"]
    # The suite's own interval (Wilson: each task passed or failed) is unchanged by the split.
    assert (m["success_low"], m["success_high"]) == pytest.approx(
        [proportion_ci(4, 8).low, proportion_ci(4, 8).high]
    )


def test_the_cluster_interval_is_narrower_when_families_do_equally_well() -> None:
    # Three families each at 1/2: no between-family spread, so the robust SE is 0 and the interval is a
    # point, while the bootstrap over tasks still sees task-to-task spread. Neither is always wider.
    tasks = [task(f"{f}{i}", f) for f in ("a", "b", "c") for i in range(2)]
    rollouts = [traj(t.id, outcome=float(i % 2)) for i, t in enumerate(tasks)]
    m = short(point(rollouts, tasks).metrics())
    assert m["success_cluster_low"] == pytest.approx(0.5) and m["success_cluster_high"] == pytest.approx(0.5)
    assert m["success_low"] < 0.5 < m["success_high"]
    assert {"a/success", "b/success", "c/success"} <= m.keys()


def test_a_family_of_one_task_has_the_wilson_interval_of_one() -> None:
    tasks = [task("c0", "calc"), task("c1", "calc"), task("q0", "sql")]
    m = short(point([traj("c0"), traj("c1", outcome=0.0), traj("q0")], tasks).metrics())
    assert m["sql/success"] == 1.0
    assert (m["sql/success_low"], m["sql/success_high"]) == (proportion_ci(1, 1).low, 1.0)


class _FakeRunner:
    """Stands in for the rollout runner: each job's outcome is read off its task id."""

    def __init__(self) -> None:
        self.jobs: list[RolloutJob] = []
        self.params = SamplingParams(temperature=0.9, top_p=0.8, max_tokens=32)

    async def run(self, jobs: list[RolloutJob]) -> RolloutResult:
        self.jobs = jobs
        trajectories = [
            traj(
                j.task.id,
                [call("calc")],
                outcome=float(j.task.id.endswith(("0", "1"))),
                wall_s=float(j.member),
            )
            for j in jobs
        ]
        return RolloutResult(trajectories)


def test_evaluate_keeps_the_tasks_and_seed_the_figures_need() -> None:
    runner = _FakeRunner()
    run = evaluate(
        cast(RolloutRunner, runner),
        "held",
        TWO_FAMILIES,
        run_id="r",
        run_seed=5,
        step=2,
        policy_version="v",
        samples_per_task=2,
    )
    p = asyncio.run(run)
    assert len(runner.jobs) == 16 and set(p.tasks) == {t.id for t in TWO_FAMILIES}
    m = short(p.metrics(), "held")
    assert m["success"] == 0.5 and (m["calc/success"], m["sql/success"]) == (0.5, 0.5)
    assert m["success_cluster_low"] == pytest.approx(0.5) and m["extra_steps"] == pytest.approx(-0.5)
    assert m["latency_p50"] == 0.5 and m["rollouts"] == 16.0
    # Reported twice (guards and metrics.jsonl), the same figures: the bootstrap seed is fixed.
    assert p.metrics() == p.metrics()


def test_an_eval_temperature_replaces_only_the_runners_temperature_on_every_job() -> None:
    runner = _FakeRunner()
    for temperature in (None, 0.0, 0.3):
        point = evaluate(
            cast(RolloutRunner, runner),
            "held",
            TWO_FAMILIES,
            run_id="r",
            run_seed=5,
            step=0,
            policy_version="v",
            temperature=temperature,
        )
        asyncio.run(point)
        if temperature is None:
            assert all(j.params is None for j in runner.jobs)  # the runner's own
            continue
        wanted = runner.params.model_copy(update={"temperature": temperature})
        assert {j.params for j in runner.jobs} == {wanted}


def test_several_samples_per_task_report_unbiased_pass_at_k_and_pass_hat_k() -> None:
    # Three samples each: t1 passes 3/3, t2 1/3, t3 0/3.
    rollouts = [traj("t1")] * 3 + [traj("t2"), traj("t2", outcome=0.0), traj("t2", outcome=0.0)]
    rollouts += [traj("t3", outcome=0.0)] * 3
    m = short(point(rollouts, ONE_FAMILY).metrics())
    # pass@3: t1 1, t2 1 - C(2,3)/C(3,3) = 1, t3 0; pass^3: t1 1, t2 C(1,3)/C(3,3) = 0, t3 0.
    assert m["pass_at_3"] == pytest.approx(2 / 3)
    assert m["pass_hat_3"] == pytest.approx(1 / 3)
    assert "pass_at_1" not in m and "pass_at_3" not in short(point(rollouts[::3], ONE_FAMILY).metrics())
