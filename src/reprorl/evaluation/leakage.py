"""Train-vs-held-out leakage: eval and holdout tasks that also appear, exactly or nearly, in training.

Two kinds of leak are found before a run starts:

- `exact`: the same task content (prompt, reference, setup, tools...) under any id, split or tags;
  renaming a task is the commonest way an eval task slips into a train file.
- `near_duplicate`: the same initial state (`Task.setup`) and a prompt whose normalised word n-gram
  Jaccard similarity reaches the threshold. The setup must match because families that carry their
  own state (sql, files) reuse question texts over different databases and file trees: those are
  different problems (the generators dedupe on prompt + setup), not leaks.

Near-duplicates are found with an inverted index over the rarest shingles of each train prompt
(the AllPairs prefix filter), so cost grows with the candidates that share rare n-grams, not with
train x held-out; every candidate is then scored exactly, so the filter never changes the answer.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from reprorl.hashing import canonical_json, content_hash
from reprorl.types import Task

__all__ = ["Leak", "LeakKind", "LeakageReport", "check_leakage", "shingles", "task_identity"]

LeakKind = Literal["exact", "near_duplicate"]

# Pairs named in `summary()`; the rest are counted. `to_json()` lists more, but not unboundedly.
_SUMMARY_PAIRS = 3
_JSON_LEAKS = 100
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Leak:
    """One held-out task of `suite` that matches one train task; `similarity` is 1.0 for exact."""

    train_id: str
    held_id: str
    suite: str
    kind: LeakKind
    similarity: float

    def __str__(self) -> str:
        how = "exact" if self.kind == "exact" else f"near-duplicate {self.similarity:.2f}"
        return f"{self.held_id} = {self.train_id} ({how})"


@dataclass(frozen=True)
class LeakageReport:
    """Every leak found, with what was compared and how, so a run can record and explain the check."""

    leaks: tuple[Leak, ...]
    train_count: int
    held_out_counts: Mapping[str, int] = field(hash=False)
    threshold: float
    n: int

    @property
    def ok(self) -> bool:
        return not self.leaks

    @property
    def leaked_tasks(self) -> tuple[tuple[str, str], ...]:
        """Distinct (suite, held-out id) pairs with at least one leak, in report order."""
        return tuple(dict.fromkeys((leak.suite, leak.held_id) for leak in self.leaks))

    def summary(self) -> str:
        """One line: the verdict, and the first few offending id pairs when there are leaks."""
        held = sum(self.held_out_counts.values())
        if self.ok:
            return (
                f"no leak: none of {held} held-out tasks ({', '.join(self.held_out_counts) or 'no suites'}) "
                f"matches any of {self.train_count} train tasks (n={self.n}, threshold {self.threshold:g})"
            )
        leaked = self.leaked_tasks
        per_suite = Counter(suite for suite, _ in leaked)
        if len(per_suite) == 1:
            what = f"{len(leaked)} {next(iter(per_suite))} task{'s' if len(leaked) != 1 else ''}"
        else:
            what = f"{len(leaked)} held-out tasks ({', '.join(f'{s} {c}' for s, c in per_suite.items())})"
        verb = "matches" if len(leaked) == 1 else "match"
        shown = ", ".join(str(leak) for leak in self.leaks[:_SUMMARY_PAIRS])
        more = (
            f", ... ({len(self.leaks) - _SUMMARY_PAIRS} more pairs)"
            if len(self.leaks) > _SUMMARY_PAIRS
            else ""
        )
        return f"leak: {what} {verb} train tasks: {shown}{more}"

    def to_json(self, *, max_leaks: int = _JSON_LEAKS) -> dict[str, Any]:
        """A JSON-able dict for a run event; at most `max_leaks` pairs are listed, all are counted."""
        return {
            "ok": self.ok,
            "train_count": self.train_count,
            "held_out_counts": dict(self.held_out_counts),
            "threshold": self.threshold,
            "n": self.n,
            "leak_count": len(self.leaks),
            "leaked_task_count": len(self.leaked_tasks),
            "leaks": [
                {
                    "train_id": leak.train_id,
                    "held_id": leak.held_id,
                    "suite": leak.suite,
                    "kind": leak.kind,
                    "similarity": leak.similarity,
                }
                for leak in self.leaks[:max_leaks]
            ],
            "summary": self.summary(),
        }


def task_identity(task: Task) -> str:
    """Hash of the task's content without `id`, `split` and `tags`: labels that a copy may change."""
    return content_hash(task.model_dump(mode="json", exclude={"id", "split", "tags"}))


def shingles(text: str, n: int = 3) -> frozenset[str]:
    """Word n-grams of the text, lowercased, punctuation and whitespace runs read as word breaks.

    Punctuation separates rather than vanishes so that `3.5` stays apart from `35`. A text shorter
    than n words is one shingle of all its words, so short prompts can still match each other.
    """
    words = _WORD.findall(text.lower())
    if len(words) <= n:
        return frozenset([" ".join(words)]) if words else frozenset()
    return frozenset(" ".join(words[i : i + n]) for i in range(len(words) - n + 1))


def _prompt_text(task: Task) -> str:
    return "\n".join(message.content for message in task.prompt)


def _prefix(ranked: list[int], threshold: float) -> list[int]:
    # J(x, y) >= t implies |x & y| >= t * |x|; two sets sharing that many ranked tokens must share one
    # among the first |x| - ceil(t|x|) + 1 of each. The epsilon keeps float error from shortening it.
    size = len(ranked)
    return ranked[: size - math.ceil(threshold * size - 1e-9) + 1]


def check_leakage(
    train: Sequence[Task],
    held_out: Mapping[str, Sequence[Task]],
    *,
    threshold: float = 0.8,
    n: int = 3,
) -> LeakageReport:
    """Compare train tasks with each held-out suite's tasks; leaks come in suite, then task order.

    For each held-out task, an exact match is reported instead of a near-duplicate of the same pair;
    near-duplicates come most similar first. Raises ValueError for a threshold outside (0, 1] or n < 1.
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")

    by_identity: dict[str, list[int]] = defaultdict(list)
    for index, task in enumerate(train):
        by_identity[task_identity(task)].append(index)

    train_sets = [shingles(_prompt_text(task), n) for task in train]
    held_sets = {suite: [shingles(_prompt_text(t), n) for t in tasks] for suite, tasks in held_out.items()}
    # Rarest shingles first, so prefixes hold the n-grams few tasks share and posting lists stay short.
    # A shingle seen once can be in no pair: it ranks -1 and is never indexed, which spares ranking
    # the bulk of a large collection's shingles; the prefix filter only needs a consistent order among
    # shingles two sets share.
    frequency = Counter(
        s for sets in (train_sets, *held_sets.values()) for shingle_set in sets for s in shingle_set
    )
    common = sorted((s for s, count in frequency.items() if count > 1), key=frequency.__getitem__)
    rank = {s: r for r, s in enumerate(common)}

    def probe_tokens(shingle_set: frozenset[str]) -> list[int]:
        return [r for r in _prefix(sorted(rank.get(s, -1) for s in shingle_set), threshold) if r >= 0]

    # Keyed by setup too: only tasks that start from the same state can be near-duplicates.
    setup_ids: dict[str, int] = {}
    postings: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, (task, shingle_set) in enumerate(zip(train, train_sets, strict=True)):
        setup_id = setup_ids.setdefault(canonical_json(task.setup), len(setup_ids))
        for token in probe_tokens(shingle_set):
            postings[(setup_id, token)].append(i)

    leaks: list[Leak] = []
    for suite, tasks in held_out.items():
        for held, held_set in zip(tasks, held_sets[suite], strict=True):
            exact = by_identity.get(task_identity(held), [])
            leaks.extend(Leak(train[i].id, held.id, suite, "exact", 1.0) for i in exact)
            held_setup = setup_ids.get(canonical_json(held.setup))
            if held_setup is None:
                continue
            candidates = {
                i for token in probe_tokens(held_set) for i in postings.get((held_setup, token), ())
            }
            near: list[tuple[float, int]] = []
            for i in sorted(candidates.difference(exact)):
                overlap = len(held_set & train_sets[i])
                similarity = overlap / (len(held_set) + len(train_sets[i]) - overlap)
                if similarity >= threshold:
                    near.append((similarity, i))
            near.sort(key=lambda item: (-item[0], item[1]))
            leaks.extend(Leak(train[i].id, held.id, suite, "near_duplicate", sim) for sim, i in near)

    return LeakageReport(
        leaks=tuple(leaks),
        train_count=len(train),
        held_out_counts={suite: len(tasks) for suite, tasks in held_out.items()},
        threshold=threshold,
        n=n,
    )
