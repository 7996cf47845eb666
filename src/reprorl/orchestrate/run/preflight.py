"""The leakage gate: a run whose held-out suites overlap its train tasks does not start.

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
from reprorl.orchestrate.run.rollouts import load_taskset
from reprorl.store import RunRecord, Store
from reprorl.types import Split


def check_run_leakage(store: Store, spec: RunSpec) -> LeakageReport:
    """The leakage report of `spec`; raises (nothing written) on a leak the spec does not allow."""
    train = load_taskset(store, str(spec.data.train)).split(Split.TRAIN)
    held_out = {}
    for ref in spec.evaluation.suites:
        taskset = load_taskset(store, str(ref))
        held_out[str(ref)] = taskset.split(Split.EVAL) + taskset.split(Split.HOLDOUT)
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
