"""The reproducibility audit: the questions a team asks before scaling a run, answered from its records.

`audit_run(store, run_id)` reads the run's folder (`run.json`, `spec.json`, `checksums.json`,
`status.json`, `metrics.jsonl`, `events.jsonl`, `rollouts/`, `sft-adapter/`), the blob store and the
registry (artifact versions, their meta, lineage), and nothing else: no author, no notes, no
re-running. Each answer is PASS with the records that prove it, or FAIL naming what is missing or
inconsistent; notes are caveats that do not fail it. What each question checks is in docs/audit.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from reprorl.audit import checks, checks_run, effective_check
from reprorl.audit.facts import Finding, RunFacts
from reprorl.store import RunRecord, Store

Status = Literal["PASS", "FAIL"]


@dataclass(frozen=True)
class Question:
    number: int
    key: str
    text: str
    check: Callable[[RunFacts], Finding]


# The checklist of the guide in ../shared/seeds, in its order and words, then the question no peer asks.
QUESTIONS = (
    Question(
        1, "base_model", "Is the exact base model and starting weight version recorded?", checks.base_model
    ),
    Question(
        2,
        "data_versions",
        "Does the run point to a fixed dataset and environment version?",
        checks.data_versions,
    ),
    Question(3, "rollouts", "Are successful and failed rollouts available for inspection?", checks.rollouts),
    Question(
        4,
        "reward_config",
        "Can every reward and loss setting be traced to configuration?",
        checks.reward_config,
    ),
    Question(
        5,
        "adapter_lineage",
        "Is each adapter tied to its base model and training settings?",
        checks.adapter_lineage,
    ),
    Question(
        6, "eval_separation", "Is the evaluation set separate from training data?", checks_run.eval_separation
    ),
    Question(
        7,
        "eval_stability",
        "Is that evaluation set stable across comparable runs?",
        checks_run.eval_stability,
    ),
    Question(
        8, "cost", "Are training time, rollout volume, token use and compute cost recorded?", checks_run.cost
    ),
    Question(
        9, "recreate", "Can another engineer recreate the run without asking its author?", checks_run.recreate
    ),
    Question(10, "effective_config", "Did every spec field take effect?", effective_check.effective),
)


@dataclass(frozen=True)
class Answer:
    """One question's verdict: the evidence for it, or what is missing, plus caveats."""

    number: int
    key: str
    question: str
    evidence: tuple[str, ...]
    missing: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.missing

    @property
    def status(self) -> Status:
        return "PASS" if self.passed else "FAIL"

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "key": self.key,
            "question": self.question,
            "status": self.status,
            "evidence": list(self.evidence),
            "missing": list(self.missing),
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class AuditReport:
    run_id: str
    answers: tuple[Answer, ...]

    @property
    def passed(self) -> bool:
        return all(a.passed for a in self.answers)

    @property
    def failed(self) -> tuple[Answer, ...]:
        return tuple(a for a in self.answers if not a.passed)

    def answer(self, key: str) -> Answer:
        (found,) = [a for a in self.answers if a.key == key]
        return found

    def summary(self) -> str:
        passed = sum(a.passed for a in self.answers)
        failed = ", ".join(str(a.number) for a in self.failed)
        return f"{passed}/{len(self.answers)} PASS" + (f"; FAIL: {failed}" if failed else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "passed": self.passed,
            "summary": self.summary(),
            "answers": [a.to_json() for a in self.answers],
        }


def audit_run(store: Store, run_id: str) -> AuditReport:
    """Answer the ten questions for `run_id` from its stored records (raises if the run is unknown)."""
    record = RunRecord(store, run_id)
    facts = RunFacts.load(store, record)
    answers = []
    for q in QUESTIONS:
        found = q.check(facts)
        answers.append(
            Answer(q.number, q.key, q.text, tuple(found.evidence), tuple(found.missing), tuple(found.notes))
        )
    return AuditReport(record.run_id, tuple(answers))
