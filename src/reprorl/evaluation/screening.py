"""Screening verdicts: each task's class from its pass rate, its replays and its exploit probes.

A task is `suspect` when an exploit probe earned reward on it (its reward can be had without the
work), else `flaky` when its verifier gave a replayed, action-for-action identical attempt another
outcome, else by its pass rate p over the attempts that were scored: `too_easy` (p = 1: nothing to
learn), `no_signal` (p = 0: no gradient either), `trainable` (0 < p < 1), ranked by p(1 - p) — the
variance of a group's reward, which is what a group-relative advantage learns from. A task none of
whose attempts could be scored (every one an infrastructure or verifier failure) is `unscored`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

CLASSES = ("trainable", "too_easy", "no_signal", "flaky", "suspect", "unscored")


@dataclass(frozen=True)
class TaskScreen:
    """What screening saw of one task."""

    task_id: str
    family: str
    passes: int  # attempts whose outcome reached 1
    scored: int  # attempts the verifier scored (the pass rate's denominator)
    attempts: int
    flaky: bool = False
    # (original, replay 1, ...) outcome credits of the replayed attempt; None where unscored
    replay_outcomes: tuple[tuple[float | None, ...], ...] = ()
    probe_hits: tuple[str, ...] = ()  # probes that earned outcome credit on this task

    @property
    def p(self) -> float | None:
        return self.passes / self.scored if self.scored else None

    @property
    def signal(self) -> float:
        """p(1 - p): how much a group of attempts at this task can teach."""
        p = self.p
        return 0.0 if p is None else p * (1.0 - p)

    @property
    def verdict(self) -> str:
        if self.probe_hits:
            return "suspect"
        if self.flaky:
            return "flaky"
        if self.p is None:
            return "unscored"
        if self.p == 1.0:
            return "too_easy"
        if self.p == 0.0:
            return "no_signal"
        return "trainable"

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "family": self.family,
            "passes": self.passes,
            "scored": self.scored,
            "attempts": self.attempts,
            "flaky": self.flaky,
            "replay_outcomes": [list(r) for r in self.replay_outcomes],
            "probe_hits": list(self.probe_hits),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskScreen:
        return cls(
            task_id=str(data["task_id"]),
            family=str(data["family"]),
            passes=int(data["passes"]),
            scored=int(data["scored"]),
            attempts=int(data["attempts"]),
            flaky=bool(data["flaky"]),
            replay_outcomes=tuple(
                tuple(None if x is None else float(x) for x in r) for r in data["replay_outcomes"]
            ),
            probe_hits=tuple(str(p) for p in data["probe_hits"]),
        )


@dataclass(frozen=True)
class ScreenReport:
    """Every task's verdict, the counts overall and per family, and the pass-rate histogram."""

    tasks: tuple[TaskScreen, ...]
    k: int
    new_version: str | None = None  # the trainable subset, registered as a task-set version
    meta: dict[str, Any] = field(default_factory=dict)

    def by_class(self, verdict: str) -> list[TaskScreen]:
        return [t for t in self.tasks if t.verdict == verdict]

    def trainable(self) -> list[TaskScreen]:
        """Trainable tasks, most signal first (ties in task order)."""
        return sorted(self.by_class("trainable"), key=lambda t: -t.signal)

    def counts(self) -> dict[str, int]:
        found = Counter(t.verdict for t in self.tasks)
        return {c: found.get(c, 0) for c in CLASSES}

    def per_family(self) -> dict[str, dict[str, int]]:
        families: dict[str, Counter[str]] = defaultdict(Counter)
        for t in self.tasks:
            families[t.family][t.verdict] += 1
        return {f: {c: families[f].get(c, 0) for c in CLASSES} for f in sorted(families)}

    def histogram(self) -> list[tuple[int, int]]:
        """(passes out of k, tasks) for 0..k, over tasks with every attempt scored."""
        found = Counter(t.passes for t in self.tasks if t.scored == self.k)
        return [(i, found.get(i, 0)) for i in range(self.k + 1)]

    def to_json(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "counts": self.counts(),
            "per_family": self.per_family(),
            "histogram": [{"passes": i, "tasks": n} for i, n in self.histogram()],
            "trainable": [{"task_id": t.task_id, "p": t.p, "signal": t.signal} for t in self.trainable()],
            "new_version": self.new_version,
            "tasks": [{**t.to_json(), "p": t.p, "verdict": t.verdict} for t in self.tasks],
            **self.meta,
        }
