"""Verifier error rates: how often each automatic scorer's pass/fail contradicts the humans or another scorer.

A scorer is the run's primary verifier (`reward.success`), each cross-verifier found as a
`cross/<name>` reward component (1.0 pass, 0.0 fail), and each judge, of `judge_scores.jsonl` or a
training judge's `judge` reward component (a score at or above 0.5 passes). "Positive" means the
scorer says pass, so a false positive is a rollout the scorer passed and a human failed:
false-positive rate = FP / (FP + TN), false-negative rate = FN / (FN + TP), precision = TP / (TP + FP).
Every rate carries a Wilson interval and is None when its denominator is 0. Without labels, pairs of
scorers are still compared: the rollouts they disagree on are the ones worth a human's time. Retried
attempts and rollouts without a reward are left out for every scorer: an infra failure says nothing
about the agent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reprorl.evaluation.judge import JudgeScore, read_scores
from reprorl.evaluation.labels import PASS_THRESHOLD, Label, latest_labels, read_labels
from reprorl.evaluation.stats import Estimate, proportion_ci
from reprorl.rollout.judging import JUDGE, JUDGED_BY
from reprorl.store import RunRecord
from reprorl.types import Trajectory

PRIMARY = "verifier"
CROSS_PREFIX = "cross/"
JUDGE_PREFIX = "judge/"

Verdicts = Mapping[str, bool]
"""Pass (True) or fail (False) by rollout id."""


def _estimate(successes: int, n: int) -> Estimate | None:
    return proportion_ci(successes, n) if n else None


def estimate_json(estimate: Estimate | None) -> dict[str, Any] | None:
    if estimate is None:
        return None
    return {
        "value": estimate.value,
        "low": estimate.low,
        "high": estimate.high,
        "n": estimate.n,
        "confidence": estimate.confidence,
        "method": estimate.method,
    }


@dataclass(frozen=True)
class ScorerErrors:
    """One scorer against the humans on the rollouts both judged; rates are None when undefined."""

    scorer: str
    versions: tuple[str, ...]  # the verifier versions behind the primary's verdicts; empty for others
    scored: int  # rollouts the scorer judged, labelled or not
    tp: int
    fp: int
    tn: int
    fn: int

    @property
    def n(self) -> int:
        return self.tp + self.fp + self.tn + self.fn

    @property
    def fp_rate(self) -> Estimate | None:
        """Of the rollouts humans failed, the share the scorer passed."""
        return _estimate(self.fp, self.fp + self.tn)

    @property
    def fn_rate(self) -> Estimate | None:
        """Of the rollouts humans passed, the share the scorer failed."""
        return _estimate(self.fn, self.fn + self.tp)

    @property
    def precision(self) -> Estimate | None:
        """Of the rollouts the scorer passed, the share humans passed too."""
        return _estimate(self.tp, self.tp + self.fp)

    def to_json(self) -> dict[str, Any]:
        return {
            "scorer": self.scorer,
            "versions": list(self.versions),
            "scored": self.scored,
            "n": self.n,
            "tp": self.tp,
            "fp": self.fp,
            "tn": self.tn,
            "fn": self.fn,
            "fp_rate": estimate_json(self.fp_rate),
            "fn_rate": estimate_json(self.fn_rate),
            "precision": estimate_json(self.precision),
        }


@dataclass(frozen=True)
class Disagreement:
    """Two scorers on the rollouts both judged: how often they differ, and which rollouts to review."""

    a: str
    b: str
    n: int
    a_only_pass: tuple[str, ...]
    b_only_pass: tuple[str, ...]

    @property
    def flagged(self) -> tuple[str, ...]:
        """Every rollout the two scorers disagree on, sorted: the ones to put before a human."""
        return tuple(sorted((*self.a_only_pass, *self.b_only_pass)))

    @property
    def rate(self) -> Estimate | None:
        return _estimate(len(self.flagged), self.n)

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "n": self.n,
            "disagree": len(self.flagged),
            "rate": estimate_json(self.rate),
            "a_only_pass": list(self.a_only_pass),
            "b_only_pass": list(self.b_only_pass),
            "flagged": list(self.flagged),
        }


@dataclass(frozen=True)
class VerifierErrors:
    """Every scorer of one run against the humans, and the primary verifier against the others."""

    run_id: str
    reviewer: str | None  # None: each rollout's newest label, whoever gave it
    rollouts: int  # rollouts considered: not retried, with a reward
    labelled: int  # of those, the ones with a human label
    scorers: tuple[ScorerErrors, ...]
    disagreements: tuple[Disagreement, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "reviewer": self.reviewer,
            "rollouts": self.rollouts,
            "labelled": self.labelled,
            "scorers": [s.to_json() for s in self.scorers],
            "disagreements": [d.to_json() for d in self.disagreements],
        }


# -- verdicts --------------------------------------------------------------------------------------


def counted(trajectory: Trajectory) -> bool:
    """Whether a rollout is judged at all: a retried infra attempt or an unscored rollout is not."""
    return not trajectory.retried and trajectory.reward is not None


def scorer_verdicts(
    trajectories: Iterable[Trajectory],
    scores: Sequence[JudgeScore] = (),
    *,
    threshold: float = PASS_THRESHOLD,
) -> dict[str, dict[str, bool]]:
    """Each scorer's pass/fail by rollout id: the verifier first, then cross-verifiers, then judges.

    Judge scores count only for rollouts that are counted here, and a failed judgement (no score)
    is no verdict; a non-finite cross component is no verdict either.
    """
    primary: dict[str, bool] = {}
    cross: dict[str, dict[str, bool]] = {}
    judges: dict[str, dict[str, bool]] = {}
    for trajectory in trajectories:
        reward = trajectory.reward
        if reward is None or not counted(trajectory):
            continue
        primary[trajectory.rollout_id] = reward.success
        for component, value in reward.components.items():
            if component.startswith(CROSS_PREFIX) and math.isfinite(value):
                # The same bar as the primary's outcome: 1 is a pass, anything short of it is not.
                cross.setdefault(component, {})[trajectory.rollout_id] = value >= 1.0
        _, named, judged_by = reward.verifier_version.rpartition(JUDGED_BY)
        if named and JUDGE in reward.components:
            # A training judge's score is on the reward itself (`data.judge`); the version names it.
            passed = reward.components[JUDGE] >= threshold
            judges.setdefault(JUDGE_PREFIX + judged_by, {})[trajectory.rollout_id] = passed
    for score in scores:
        if score.score is not None and score.rollout_id in primary:
            judges.setdefault(JUDGE_PREFIX + score.judge, {})[score.rollout_id] = score.score >= threshold
    out = {PRIMARY: primary} if primary else {}
    out.update({name: cross[name] for name in sorted(cross)})
    out.update({name: judges[name] for name in sorted(judges)})
    return out


def verifier_versions(trajectories: Iterable[Trajectory]) -> tuple[str, ...]:
    return tuple(sorted({t.reward.verifier_version for t in trajectories if t.reward and counted(t)}))


def human_verdicts(
    labels: Iterable[Label], reviewer: str | None = None, *, threshold: float = PASS_THRESHOLD
) -> dict[str, bool]:
    """Each rollout's newest label (by `reviewer` only, when given) as pass/fail."""
    return {rid: label.passed(threshold) for rid, label in latest_labels(labels, reviewer).items()}


# -- comparisons -----------------------------------------------------------------------------------


def error_rates(
    scorer: str, verdicts: Verdicts, human: Verdicts, versions: Sequence[str] = ()
) -> ScorerErrors:
    """Confusion counts of `verdicts` against `human` on the rollouts both have; pass is positive."""
    counts = {(True, True): 0, (True, False): 0, (False, False): 0, (False, True): 0}
    for rollout_id, says_pass in verdicts.items():
        truth = human.get(rollout_id)
        if truth is not None:
            counts[(says_pass, truth)] += 1
    return ScorerErrors(
        scorer=scorer,
        versions=tuple(versions),
        scored=len(verdicts),
        tp=counts[(True, True)],
        fp=counts[(True, False)],
        tn=counts[(False, False)],
        fn=counts[(False, True)],
    )


def disagreement(a: str, b: str, verdicts_a: Verdicts, verdicts_b: Verdicts) -> Disagreement:
    """Where two scorers differ, over the rollouts both judged."""
    both = sorted(verdicts_a.keys() & verdicts_b.keys())
    return Disagreement(
        a=a,
        b=b,
        n=len(both),
        a_only_pass=tuple(r for r in both if verdicts_a[r] and not verdicts_b[r]),
        b_only_pass=tuple(r for r in both if verdicts_b[r] and not verdicts_a[r]),
    )


def summarize(
    run_id: str,
    verdicts: Mapping[str, Verdicts],
    human: Verdicts,
    *,
    reviewer: str | None = None,
    versions: Sequence[str] = (),
) -> VerifierErrors:
    """Every scorer against the humans, and the primary verifier against each other scorer.

    `versions` names the primary verifier; labels of rollouts no scorer judged are not counted.
    """
    primary = verdicts.get(PRIMARY, {})
    judged = set().union(*(v.keys() for v in verdicts.values())) if verdicts else set()
    return VerifierErrors(
        run_id=run_id,
        reviewer=reviewer,
        rollouts=len(judged),
        labelled=len(judged & human.keys()),
        scorers=tuple(
            error_rates(name, v, human, versions if name == PRIMARY else ()) for name, v in verdicts.items()
        ),
        disagreements=tuple(
            disagreement(PRIMARY, name, primary, v) for name, v in verdicts.items() if name != PRIMARY
        ),
    )


def verifier_errors(run: RunRecord, reviewer: str | None = None) -> VerifierErrors:
    """The run's scorers against its human labels (newest per rollout, or `reviewer`'s) and each other."""
    # Imported here: DuckDB and pyarrow load only when rollouts are read.
    from reprorl.store.rollout_query import RolloutStore

    trajectories = [t for t in RolloutStore(run).trajectories() if counted(t)]
    verdicts = scorer_verdicts(trajectories, read_scores(run))
    return summarize(
        run.run_id,
        verdicts,
        human_verdicts(read_labels(run), reviewer),
        reviewer=reviewer,
        versions=verifier_versions(trajectories),
    )
