"""Replay's comparisons: the first differing token, logprob, context, tool result, reward or ending."""

from __future__ import annotations

import math

from reprorl.orchestrate.jobs.replay import run_of
from reprorl.orchestrate.jobs.replay_compare import ReplayReport, compare_live, compare_sample
from reprorl.policy.sampling import Sample
from reprorl.types import Reward, Split, Termination, ToolOutcome, ToolResult, Trajectory, Turn


def _trajectory(**changes: object) -> Trajectory:
    turn = Turn(
        index=0,
        prompt_token_ids=(1, 2),
        token_ids=(5, 6, 7),
        logprobs=(-0.5, -0.25, -0.125),
        tool_results=(ToolResult(call_id="c", name="calc", outcome=ToolOutcome.OK, content="4"),),
        seed=3,
    )
    base = Trajectory(
        run_id="r",
        rollout_id="r/train/0/t/0",
        split=Split.TRAIN,
        task_id="t",
        task_hash="h",
        turns=(turn,),
        reward=Reward(total=1.0, components={"outcome": 1.0}, verifier_version="v"),
        termination=Termination.ANSWERED,
    )
    return base.model_copy(update=changes)


def _sample(tokens: tuple[int, ...], logprobs: tuple[float, ...]) -> Sample:
    return Sample("r/train/0/t/0/0", tokens, logprobs, "stop", "")


def test_identical_samples_report_nothing() -> None:
    report = ReplayReport("x", "recorded")
    compare_sample(report, 0, _trajectory(), _sample((5, 6, 7), (-0.5, -0.25, -0.125)))
    assert report.identical and (report.turns, report.tokens) == (1, 3)
    assert (report.compared, report.agreed, report.agreement) == (3, 3, 1.0)


def test_the_first_differing_token_is_named() -> None:
    report = ReplayReport("x", "recorded")
    compare_sample(report, 0, _trajectory(), _sample((5, 9, 8), (-0.5, -0.25, -0.125)))
    first = report.first
    assert first is not None and (first.where, first.turn, first.index, first.recorded, first.replayed) == (
        "token",
        0,
        1,
        6,
        9,
    )
    # One of the three recorded tokens was drawn again before the first difference.
    assert (report.compared, report.agreed) == (3, 1) and report.to_json()["agreement"] == 1 / 3
    shorter = ReplayReport("x", "recorded")
    compare_sample(shorter, 0, _trajectory(), _sample((5, 6), (-0.5, -0.25)))
    assert shorter.first is not None and (shorter.first.where, shorter.first.index) == ("token", 2)
    assert (shorter.compared, shorter.agreed) == (3, 2)
    assert ReplayReport("x", "live").agreement is None  # nothing compared is not "all agreed"


def test_a_logprob_one_ulp_off_is_a_difference() -> None:
    report = ReplayReport("x", "recorded")
    off = math.nextafter(-0.25, 0.0)
    compare_sample(report, 0, _trajectory(), _sample((5, 6, 7), (-0.5, off, -0.125)))
    assert report.first is not None and (report.first.where, report.first.index) == ("logprob", 1)


def test_live_differences_in_tools_reward_and_ending() -> None:
    recorded = _trajectory()
    other_result = recorded.turns[0].model_copy(
        update={"tool_results": (ToolResult(call_id="c", name="calc", outcome=ToolOutcome.OK, content="5"),)}
    )
    cases = {
        "tool_result": _trajectory(turns=(other_result,)),
        "reward": _trajectory(reward=Reward(total=0.0, components={"outcome": 0.0}, verifier_version="v")),
        "termination": _trajectory(termination=Termination.MAX_TURNS),
        "context": _trajectory(turns=(recorded.turns[0].model_copy(update={"prompt_token_ids": (1, 3)}),)),
        "turns": _trajectory(turns=(recorded.turns[0], recorded.turns[0].model_copy(update={"index": 1}))),
    }
    for where, live in cases.items():
        report = ReplayReport("x", "live")
        compare_live(report, recorded, live)
        assert [d.where for d in report.differences] == [where], where
    same = ReplayReport("x", "live")
    # Timings differ on every run and are not part of the comparison.
    timed = recorded.turns[0].model_copy(update={"tool_s": 9.0, "sample_s": 3.0})
    compare_live(same, recorded, _trajectory(turns=(timed,), wall_s=5.0))
    assert same.identical

    # A component added to the platform since the record was written weighs nothing in its total:
    # not a difference. The same component with another value in both is one.
    newer = ReplayReport("x", "live")
    grown = Reward(total=1.0, components={"outcome": 1.0, "failed_calls": 0.0}, verifier_version="v")
    compare_live(newer, recorded, _trajectory(reward=grown))
    assert newer.identical
    changed = ReplayReport("x", "live")
    counted = _trajectory(
        reward=Reward(total=1.0, components={"outcome": 1.0, "failed_calls": 0.0}, verifier_version="v")
    )
    compare_live(
        changed,
        counted,
        _trajectory(reward=grown.model_copy(update={"components": {"outcome": 1.0, "failed_calls": 2.0}})),
    )
    assert [d.where for d in changed.differences] == ["reward"]


def test_run_of() -> None:
    assert run_of("20261130T000000000000Z-abcdef/train/0/t/1") == "20261130T000000000000Z-abcdef"
