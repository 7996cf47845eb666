"""Regression suites: a versioned set of important failures, grown case by case from recorded rollouts.

The tasks of chosen rollouts (found by content hash among the task sets their run pinned) are added
to a suite as eval cases tagged `regression`. Adding cases registers the suite's next version;
adding cases it already has changes nothing (same content, same version). Runs pin the version they
were measured on, and `reprorl runs compare --both` reports two runs on their own versions when they differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reprorl.config.load import stored_spec
from reprorl.errors import ArtifactNotFoundError, UserInputError
from reprorl.evaluation.leakage import task_identity
from reprorl.orchestrate.run.rollouts import load_taskset
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import Split, Task, TaskSet

TAG = "regression"


@dataclass(frozen=True)
class Grown:
    suite: str  # name@vN now
    added: tuple[str, ...]  # ids of the new cases
    total: int


def failed_tasks(store: Store, record: RunRecord, where: str) -> list[Task]:
    """The distinct tasks of `record`'s rollouts matching `where`, from the task sets the run pinned."""
    spec = stored_spec(record.spec())
    known: dict[str, Task] = {}
    for ref in (spec.data.train, *spec.evaluation.suites):
        for task in load_taskset(store, str(ref)).tasks:
            known.setdefault(task.content_hash, task)
    rows = RolloutStore(record).query(where, columns=["task_hash"]).to_pylist()
    if not rows:
        raise UserInputError(f"no rollout of run {record.run_id} matches {where!r}", field="--where")
    hashes = list(dict.fromkeys(str(r["task_hash"]) for r in rows))
    missing = [h for h in hashes if h not in known]
    if missing:
        raise UserInputError(f"run {record.run_id}: task {missing[0]} is in none of the task sets it pinned")
    return [known[h] for h in hashes]


def grow_suite(store: Store, suite: str, tasks: Sequence[Task]) -> Grown:
    """Add `tasks` to the newest version of `suite` (or start it) as eval cases tagged `regression`."""
    try:
        current = list(load_taskset(store, store.pin_newest(suite)).tasks)
    except ArtifactNotFoundError:
        current = []
    have = {task_identity(t) for t in current}
    added = []
    for task in tasks:
        if task_identity(task) in have:
            continue
        case = task.model_copy(
            update={
                "id": f"{suite}-{len(current) + 1:04d}",
                "split": Split.EVAL,
                "tags": tuple(sorted({*task.tags, TAG})),
            }
        )
        current.append(case)
        have.add(task_identity(task))
        added.append(case.id)
    version = store.add_bytes(suite, TaskSet(name=suite, tasks=tuple(current)).to_jsonl(), kind="taskset")
    return Grown(f"{version.name}@v{version.version}", tuple(added), len(current))
