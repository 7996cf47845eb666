"""Judging a stored run: an LLM judge scores the run's rollouts into `judge_scores.jsonl`, apart from
its rewards, so `reprorl rewards review` and `reprorl rewards errors` can hold it against human labels.

Only rollouts a person could label are judged: retried infra attempts are left out. A rollout whose
task is no longer in the store (or changed since) is counted apart rather than judged blind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprorl.config.load import stored_spec
from reprorl.evaluation.judge import JudgeConfig, JudgeScore, make_judge, write_scores
from reprorl.evaluation.labels import PASS_THRESHOLD
from reprorl.orchestrate.run.judge_gate import newest_audit
from reprorl.orchestrate.run.judge_reward import judge_cache
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import Task, TaskSet, Trajectory

BATCH = 64  # scores are merged into the file after each batch, so an interruption keeps them


@dataclass
class JudgedRun:
    """What one `judge_run` did: how many rollouts were judged, how they scored, what it cost."""

    run_id: str
    judge: str
    audit: str | None  # the judge's newest robustness audit, e.g. 'judge-audit@v2'
    audit_refused: bool | None
    selected: int  # rollouts matching the selection, retried attempts left out
    judged: int = 0  # judgements with a score
    passed: int = 0  # of those, scores at or above PASS_THRESHOLD (0.5), as for human labels
    score_sum: float = 0.0
    failures: Counter[str] = field(default_factory=Counter)
    no_task: int = 0  # rollouts whose task is gone from the store or changed since
    requests: int = 0
    cache_hits: int = 0
    cost_usd: float = 0.0
    path: Path | None = None

    @property
    def mean_score(self) -> float | None:
        return self.score_sum / self.judged if self.judged else None

    def add(self, scores: Sequence[JudgeScore]) -> None:
        for score in scores:
            if score.score is None:
                self.failures[score.failure or "unknown"] += 1
                continue
            self.judged += 1
            self.score_sum += score.score
            self.passed += score.score >= PASS_THRESHOLD

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "judge": self.judge,
            "audit": self.audit,
            "audit_refused": self.audit_refused,
            "selected": self.selected,
            "judged": self.judged,
            "passed": self.passed,
            "mean_score": self.mean_score,
            "failures": dict(sorted(self.failures.items())),
            "no_task": self.no_task,
            "requests": self.requests,
            "cache_hits": self.cache_hits,
            "cost_usd": self.cost_usd,
            "scores_file": None if self.path is None else str(self.path),
        }


def run_tasks(store: Store, record: RunRecord) -> dict[str, Task]:
    """The tasks of the run's training set and evaluation suites, by id, as the store holds them now."""
    spec = stored_spec(record.spec())
    tasks: dict[str, Task] = {}
    for ref in [str(spec.data.train), *(str(s) for s in spec.evaluation.suites)]:
        tasks.update({t.id: t for t in TaskSet.from_jsonl(ref, store.read(ref), source=ref).tasks})
    return tasks


def judge_run(
    store: Store,
    record: RunRecord,
    config: JudgeConfig,
    *,
    where: str | None = None,
    limit: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> JudgedRun:
    """Score the run's rollouts matching `where` (a condition on the rollout columns; the first
    `limit` in step and rollout order) with the judge of `config`, merging the scores into the run's
    `judge_scores.jsonl` batch by batch (`on_progress(done, total)` after each). Answers are cached
    on disk: judging again sends nothing."""
    rollouts = RolloutStore(record)
    if where is not None:
        rollouts.count(where)  # checked alone, so it cannot reach past the parentheses added below
    condition = "NOT retried" if where is None else f"NOT retried AND ({where})"
    selected = rollouts.count(condition)
    selected = selected if limit is None else min(selected, limit)
    with make_judge(config, judge_cache(store.root)) as judge:
        audit = newest_audit(store, judge.judge_id)
        result = JudgedRun(
            record.run_id,
            judge.judge_id,
            None if audit is None else audit.label,
            None if audit is None else bool(audit.meta.get("refused")),
            selected,
        )
        tasks = run_tasks(store, record)
        done = 0
        if on_progress is not None:
            on_progress(done, selected)
        for batch in _batches(rollouts.trajectories(condition, limit=limit), BATCH):
            items: list[tuple[Trajectory, Task | str]] = []
            for trajectory in batch:
                task = tasks.get(trajectory.task_id)
                if task is None or task.content_hash != trajectory.task_hash:
                    result.no_task += 1
                else:
                    items.append((trajectory, task))
            scores = judge.score_many(items)
            result.add(scores)
            if scores:
                result.path = write_scores(record, scores)
            done += len(batch)
            if on_progress is not None:
                on_progress(done, selected)
        result.requests, result.cache_hits, result.cost_usd = (
            judge.requests,
            judge.cache_hits,
            judge.spent_usd,
        )
    return result


def _batches(trajectories: Iterator[Trajectory], size: int) -> Iterator[list[Trajectory]]:
    batch: list[Trajectory] = []
    for trajectory in trajectories:
        batch.append(trajectory)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
