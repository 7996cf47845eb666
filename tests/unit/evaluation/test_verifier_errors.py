"""Scorer errors against human labels, and disagreement between scorers, on hand-built verdicts."""

from __future__ import annotations

import json

import pytest

from reprorl.evaluation.judge import JudgeScore
from reprorl.evaluation.labels import Label
from reprorl.evaluation.stats import proportion_ci
from reprorl.evaluation.verifier_errors import (
    PRIMARY,
    disagreement,
    error_rates,
    human_verdicts,
    scorer_verdicts,
    summarize,
    verifier_versions,
)
from reprorl.types import Reward, Trajectory
from rollout_records import make

RUN = "20250101T000000000000Z-abc123"


def rid(i: int) -> str:
    return f"{RUN}/r{i:04d}"


def rollout(
    i: int,
    passed: bool | None,
    *,
    cross: dict[str, float] | None = None,
    retried: bool = False,
    version: str = "sha256:v1",
) -> Trajectory:
    """Rollout `i`: the verifier passed it, failed it, or (None) gave no reward."""
    reward = None
    if passed is not None:
        components = {"outcome": 1.0 if passed else 0.0, **(cross or {})}
        reward = Reward(total=components["outcome"], components=components, verifier_version=version)
    return make(i, "answered", RUN).model_copy(update={"reward": reward, "retried": retried})


def judged(i: int, score: float | None, judge: str = "m@abc") -> JudgeScore:
    return JudgeScore(
        run_id=RUN,
        rollout_id=rid(i),
        judge=judge,
        judge_model=judge.split("@")[0],
        prompt_hash="sha256:abc",
        request_hash=f"sha256:{i}",
        score=score,
        failure=None if score is not None else "parse_error",
        time="2025-01-01T00:00:00+00:00",
    )


def label(i: int, value: str | float, reviewer: str = "ann", time: str = "2025-01-01T00:00:00Z") -> Label:
    return Label(run_id=RUN, rollout_id=rid(i), label=value, reviewer=reviewer, time=time)  # type: ignore[arg-type]


def verdicts(**groups: list[int]) -> tuple[dict[str, bool], dict[str, bool]]:
    """Scorer and human verdicts with rollouts numbered in blocks: tp, fp, tn, fn, then unlabelled."""
    scorer: dict[str, bool] = {}
    human: dict[str, bool] = {}
    for kind, ids in groups.items():
        for i in ids:
            if kind != "unlabelled_human":
                scorer[rid(i)] = kind in ("tp", "fp", "unlabelled_pass")
            if kind in ("tp", "fp", "tn", "fn", "unlabelled_human"):
                human[rid(i)] = kind in ("tp", "fn", "unlabelled_human")
    return scorer, human


def test_counts_rates_and_intervals_are_those_of_the_right_counts() -> None:
    scorer, human = verdicts(
        tp=list(range(0, 5)),
        fp=[5, 6],
        tn=list(range(7, 14)),
        fn=[14],
        unlabelled_pass=[15, 16],  # scored, never labelled: not counted
        unlabelled_human=[17, 18],  # labelled, never scored: not counted
    )
    errors = error_rates("verifier", scorer, human, ["sha256:v1"])
    assert (errors.tp, errors.fp, errors.tn, errors.fn) == (5, 2, 7, 1)
    assert errors.n == 15 and errors.scored == 17 and errors.versions == ("sha256:v1",)
    # FP rate: passes among what humans failed; FN rate: fails among what humans passed.
    assert errors.fp_rate == proportion_ci(2, 9)
    assert errors.fn_rate == proportion_ci(1, 6)
    assert errors.precision == proportion_ci(5, 7)
    assert errors.fp_rate is not None and errors.fp_rate.value == pytest.approx(2 / 9)
    assert errors.fp_rate.method == "wilson" and errors.fp_rate.confidence == 0.95


def test_an_undefined_rate_is_none_not_zero() -> None:
    scorer, human = verdicts(tp=[0, 1], fn=[2])  # humans failed nothing: no FP rate
    errors = error_rates("verifier", scorer, human)
    assert errors.fp_rate is None and errors.fn_rate == proportion_ci(1, 3)
    assert errors.precision == proportion_ci(2, 2)
    scorer, human = verdicts(tn=[0], fn=[1])  # the scorer passed nothing: no precision
    errors = error_rates("verifier", scorer, human)
    assert errors.precision is None and errors.fp_rate == proportion_ci(0, 1)
    nothing = error_rates("verifier", {rid(0): True}, {rid(1): False})
    assert nothing.n == 0 and nothing.fp_rate is None and nothing.fn_rate is None
    assert nothing.to_json()["fp_rate"] is None and nothing.to_json()["fn_rate"] is None


def test_disagreement_flags_exactly_the_rollouts_the_two_differ_on() -> None:
    a = {rid(0): True, rid(1): True, rid(2): False, rid(3): False, rid(4): True}
    b = {rid(0): True, rid(1): False, rid(2): True, rid(3): False, rid(9): False}
    pair = disagreement("verifier", "cross/sql", a, b)
    assert pair.n == 4  # r0004 and r0009 were scored by one side only
    assert pair.a_only_pass == (rid(1),) and pair.b_only_pass == (rid(2),)
    assert pair.flagged == (rid(1), rid(2))
    assert pair.rate == proportion_ci(2, 4)
    assert disagreement("verifier", "judge/x", a, {}).rate is None


def test_retried_and_unrewarded_rollouts_count_for_no_scorer() -> None:
    trajectories = [
        rollout(0, True, cross={"cross/sql": 1.0}),
        rollout(1, False, cross={"cross/sql": 1.0, "cross/files": 0.0}),
        rollout(2, True, cross={"cross/sql": 0.0}, retried=True),  # an infra attempt
        rollout(3, None),  # no reward: the verifier never ran
        rollout(4, False, cross={"cross/sql": float("nan")}),  # no verdict from that verifier
        rollout(5, True, version="sha256:v2"),
    ]
    scores = [
        judged(0, 0.5),  # at the threshold: a pass
        judged(1, 0.49),
        judged(2, 1.0),  # the retried attempt: not counted
        judged(3, 1.0),  # unrewarded: not counted
        judged(4, None),  # a failed judgement is no verdict
        judged(5, 0.0, judge="other@def"),
    ]
    got = scorer_verdicts(trajectories, scores)
    assert list(got) == [PRIMARY, "cross/files", "cross/sql", "judge/m@abc", "judge/other@def"]
    assert got[PRIMARY] == {rid(0): True, rid(1): False, rid(4): False, rid(5): True}
    assert got["cross/sql"] == {rid(0): True, rid(1): True}
    assert got["cross/files"] == {rid(1): False}
    assert got["judge/m@abc"] == {rid(0): True, rid(1): False}
    assert got["judge/other@def"] == {rid(5): False}
    assert verifier_versions(trajectories) == ("sha256:v1", "sha256:v2")
    assert scorer_verdicts([rollout(0, True, retried=True), rollout(1, None)]) == {}


def test_a_training_judge_is_read_from_the_reward_it_joined() -> None:
    judged_runs = [
        rollout(0, True, cross={"judge": 0.5}, version="sha256:v1+judge:m@abc"),
        rollout(1, True, cross={"judge": 0.2}, version="sha256:v1+judge:m@abc"),
        rollout(2, True, cross={"judge": 1.0}, version="sha256:v1+judge:m@abc", retried=True),
        rollout(3, False, cross={"judge": 1.0}, version="sha256:v1"),  # no judge named: a plain component
    ]
    got = scorer_verdicts(judged_runs, [judged(1, 0.9, judge="other@def")])
    assert list(got) == [PRIMARY, "judge/m@abc", "judge/other@def"]
    assert got["judge/m@abc"] == {rid(0): True, rid(1): False}
    assert got["judge/other@def"] == {rid(1): True}


def test_human_verdicts_take_the_newest_label_and_a_score_passes_from_half() -> None:
    labels = [
        label(0, "pass", time="2025-01-01T00:00:00Z"),
        label(0, "fail", time="2025-01-02T00:00:00Z"),  # newer: this one counts
        label(1, 0.5),
        label(2, 0.4),
        label(3, "pass", reviewer="bob"),
    ]
    assert human_verdicts(labels) == {rid(0): False, rid(1): True, rid(2): False, rid(3): True}
    assert human_verdicts(labels, "bob") == {rid(3): True}


def test_summary_compares_every_scorer_and_pairs_the_verifier_with_each_other() -> None:
    trajectories = [
        rollout(0, True, cross={"cross/sql": 1.0}),
        rollout(1, True, cross={"cross/sql": 0.0}),  # a planted FP of the verifier, caught by sql
        rollout(2, False, cross={"cross/sql": 0.0}),
        rollout(3, False, cross={"cross/sql": 1.0}),  # a planted FN of the verifier
        rollout(4, True),  # not labelled
    ]
    scores = [judged(0, 0.9), judged(1, 0.2), judged(2, 0.1), judged(3, 0.1)]
    human = human_verdicts([label(0, "pass"), label(1, "fail"), label(2, "fail"), label(3, "pass")])
    result = summarize(RUN, scorer_verdicts(trajectories, scores), human, versions=["sha256:v1"])
    assert (result.rollouts, result.labelled) == (5, 4)
    by_name = {s.scorer: s for s in result.scorers}
    primary, sql, judge = by_name[PRIMARY], by_name["cross/sql"], by_name["judge/m@abc"]
    assert (primary.tp, primary.fp, primary.tn, primary.fn) == (1, 1, 1, 1)
    assert primary.scored == 5 and primary.versions == ("sha256:v1",) and sql.versions == ()
    assert (sql.tp, sql.fp, sql.tn, sql.fn) == (2, 0, 2, 0) and sql.fp_rate == proportion_ci(0, 2)
    assert (judge.tp, judge.fp, judge.tn, judge.fn) == (1, 0, 2, 1)
    assert [(d.a, d.b, d.flagged) for d in result.disagreements] == [
        (PRIMARY, "cross/sql", (rid(1), rid(3))),
        (PRIMARY, "judge/m@abc", (rid(1),)),
    ]
    out = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert out["scorers"][0]["fp_rate"] == {
        "value": 0.5,
        "low": proportion_ci(1, 2).low,
        "high": proportion_ci(1, 2).high,
        "n": 2,
        "confidence": 0.95,
        "method": "wilson",
    }
    assert out["disagreements"][0]["flagged"] == [rid(1), rid(3)]


def test_without_labels_only_disagreement_is_defined() -> None:
    trajectories = [rollout(0, True, cross={"cross/sql": 0.0}), rollout(1, False, cross={"cross/sql": 0.0})]
    result = summarize(RUN, scorer_verdicts(trajectories), {})
    assert result.labelled == 0 and all(s.n == 0 and s.fp_rate is None for s in result.scorers)
    assert result.disagreements[0].flagged == (rid(0),)
    assert result.disagreements[0].rate == proportion_ci(1, 2)
    empty = summarize(RUN, {}, {rid(0): True})
    assert (empty.rollouts, empty.labelled, empty.scorers, empty.disagreements) == (0, 0, (), ())
