"""The gates before a run's record: held-out suites that overlap its train tasks, and family weights
that do not fit them, stop the run before anything is written.

Before any record is written, the spec's train split is compared with every eval suite's eval and
holdout tasks (exact content under any id, and near-duplicate prompts over the same setup). A leak
refuses the run with one line naming the offending task ids, unless the spec sets
`evaluation.allow_leakage`, in which case the run goes on and the report is an event of its record.
"""

from __future__ import annotations

from typing import Any

from reprorl.config import RunSpec
from reprorl.errors import UserInputError
from reprorl.evaluation.leakage import LeakageReport, check_leakage
from reprorl.store import RunRecord, Store
from reprorl.types import Split


def check_run_leakage(store: Store, spec: RunSpec) -> LeakageReport:
    """The leakage report of `spec`; raises (nothing written) on a leak the spec does not allow."""
    train_ref = str(spec.data.train)
    train = store.taskset(train_ref).split(Split.TRAIN)
    held_out = {}
    for i, ref in enumerate(spec.evaluation.suites):
        field = f"evaluation.suites[{i}]"
        if _digest(str(ref)) == _digest(train_ref):
            raise UserInputError(
                f"{ref} is the train task set (data.train) itself; a suite measures held-out tasks: "
                "name a suite of eval or holdout tasks (reprorl tasks generate makes both)",
                field=field,
            )
        taskset = store.taskset(str(ref))
        tasks = taskset.split(Split.EVAL) + taskset.split(Split.HOLDOUT)
        if not tasks:
            raise UserInputError(
                f"{ref} has no eval or holdout tasks ({len(taskset.tasks)} tasks of other splits), so an "
                "eval point could measure nothing; name a suite of eval or holdout tasks",
                field=field,
            )
        held_out[str(ref)] = tasks
    report = check_leakage(train, held_out)
    if not report.ok and not spec.evaluation.allow_leakage:
        raise UserInputError(
            f"{report.summary()}; take them out of data.train or the suite, or set "
            "evaluation.allow_leakage = true to run anyway (it is recorded)",
            field="evaluation.suites",
        )
    return report


def record_leakage(record: RunRecord, report: LeakageReport) -> None:
    """The check's outcome as a run event: `leakage_check` when clean, `leakage_allowed` when not."""
    details: dict[str, Any] = report.to_json()
    record.event("leakage_check" if report.ok else "leakage_allowed", **details)


def _digest(ref: str) -> str:
    return ref.rsplit("@", 1)[-1]


def check_demonstrations(store: Store, spec: RunSpec) -> None:
    """`learning.sft_demonstrations` asks for no more demonstrations than the train split has tasks."""
    count = spec.learning.sft_demonstrations
    if count is None or not spec.learning.sft_steps:
        return
    tasks = len(store.taskset(str(spec.data.train)).split(Split.TRAIN))
    if count > tasks:
        raise UserInputError(
            f"{count} demonstrations asked for, but {spec.data.train} has {tasks} train tasks; set it "
            f"to at most {tasks}, or leave it out to demonstrate every task",
            field="learning.sft_demonstrations",
        )


def check_family_weights(store: Store, spec: RunSpec) -> None:
    """`data.family_weights` names exactly the env families of the train split (0 leaves one out)."""
    weights = spec.data.family_weights
    if weights is None:
        return
    present = {t.family for t in store.taskset(str(spec.data.train)).split(Split.TRAIN)}
    unknown, unnamed = sorted(set(weights) - present), sorted(present - set(weights))
    if unknown:
        raise UserInputError(
            f"names {', '.join(unknown)}, of which {spec.data.train} has no train tasks (its families: "
            f"{', '.join(sorted(present))}); weigh those, or train on a set that has them "
            "(reprorl tasks merge makes one)",
            field="data.family_weights",
        )
    if unnamed:
        raise UserInputError(
            f"gives no weight to {', '.join(unnamed)}, a family of {spec.data.train}; give each family "
            "of the set a weight (0 leaves it out)",
            field="data.family_weights",
        )
