"""Report records: what one run left on disk, each read once, an error line in place of what is unreadable.

A report shows whatever survived: a missing or damaged record becomes a line in its section
instead of stopping the report. Nothing here writes to the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reprorl.errors import ReprorlError
from reprorl.evaluation.judge import JudgeScore, read_scores
from reprorl.evaluation.labels import Label, read_labels
from reprorl.hashing import HASH_PREFIX
from reprorl.store import RunRecord, Store
from reprorl.store.documents import json_doc, plain_row
from reprorl.store.rollout_query import RolloutStore
from reprorl.store.runs import LogReadResult
from reprorl.types import Task, TaskSet, Trajectory

ROLLOUT_COLUMNS = (
    "step",
    "rollout_id",
    "split",
    "task_id",
    "task_hash",
    "termination",
    "error",
    "retried",
    "reward_total",
    "reward_components",
    "n_turns",
    "n_tool_calls",
    "completion_tokens",
)


@dataclass
class RunView:
    """One run's records as a report reads them: documents, logs, rollout rows, labels and judge scores."""

    store: Store
    record: RunRecord
    info: dict[str, Any] | None
    info_error: str | None
    spec: dict[str, Any] | None
    spec_error: str | None
    status: dict[str, Any] | None
    integrity_error: str | None
    metrics: list[dict[str, Any]]
    bad_metric_lines: list[int]
    events: list[dict[str, Any]]
    bad_event_lines: list[int]
    rollouts: list[dict[str, Any]] | None
    rollouts_error: str | None
    labels: list[Label] = field(default_factory=list)
    labels_error: str | None = None
    scores: list[JudgeScore] = field(default_factory=list)
    scores_error: str | None = None
    _reader: RolloutStore | None = field(default=None, repr=False)
    _tasks: dict[str, Task] | None = field(default=None, repr=False)

    @classmethod
    def load(
        cls,
        store: Store,
        record: RunRecord,
        *,
        rollouts: RolloutStore | None = None,
        metrics: LogReadResult | None = None,
        events: LogReadResult | None = None,
    ) -> RunView:
        """Read a run's records; a caller that holds the run's rollout store or logs already passes
        them (its verified part files stay verified, its logs are not read again)."""
        info, info_error = json_doc(record.path / "run.json")
        spec, spec_error = json_doc(record.path / "spec.json")
        status, _ = json_doc(record.path / "status.json")
        integrity_error = None
        try:
            record.verify()
        except (ReprorlError, OSError) as exc:
            integrity_error = str(exc)
        metrics = metrics if metrics is not None else record.metrics()
        events = events if events is not None else record.events()
        rows, rollouts_error, reader = None, None, rollouts
        try:
            reader = reader or RolloutStore(record)
            table = reader.query(columns=ROLLOUT_COLUMNS)
            rows = [plain_row(row) for row in table.to_pylist()]
        except (ReprorlError, OSError) as exc:
            rollouts_error = str(exc)
        view = cls(
            store,
            record,
            info,
            info_error,
            spec,
            spec_error,
            status,
            integrity_error,
            metrics.records,
            metrics.bad_lines,
            events.records,
            events.bad_lines,
            rows,
            rollouts_error,
            _reader=reader,
        )
        try:
            view.labels = read_labels(record)
        except (ReprorlError, OSError) as exc:
            view.labels_error = str(exc)
        try:
            view.scores = read_scores(record)
        except (ReprorlError, OSError) as exc:
            view.scores_error = str(exc)
        return view

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def inputs(self) -> dict[str, str]:
        found = (self.info or {}).get("inputs")
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}

    def train_lines(self) -> list[dict[str, Any]]:
        """Metric lines of policy-gradient steps (SFT and eval lines carry their own `stage`)."""
        return [
            m for m in self.metrics if m.get("stage") in (None, "train") and isinstance(m.get("step"), int)
        ]

    def eval_lines(self) -> list[dict[str, Any]]:
        return [m for m in self.metrics if m.get("stage") == "eval" and isinstance(m.get("step"), int)]

    def events_named(self, *kinds: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") in kinds]

    def trajectory(self, rollout_id: str) -> Trajectory:
        """The full stored record of one rollout (raises when it cannot be read)."""
        if self._reader is None:
            raise ReprorlError(self.rollouts_error or "the rollout store cannot be read")
        return self._reader.get(rollout_id)

    def label(self, address: str) -> str:
        """`name@vN` when the registry knows the hash, else the hash itself."""
        if address.startswith(HASH_PREFIX) and self.store.has_registry():
            try:
                return self.store.registry.lookup(None, digest=address.removeprefix(HASH_PREFIX)).label
            except ReprorlError:
                pass
        return address

    def task(self, task_hash: str) -> Task | None:
        """A task of the run's pinned task sets by its content hash; None when it cannot be found."""
        if self._tasks is None:
            self._tasks = task_index(self.store, self.inputs)
        return self._tasks.get(task_hash)


def task_index(store: Store, inputs: dict[str, str]) -> dict[str, Task]:
    """Every task of a run's pinned train and eval task sets, by content hash (unreadable sets skipped)."""
    tasks: dict[str, Task] = {}
    addresses = sorted({v for k, v in inputs.items() if k == "data.train" or k.startswith("evaluation.")})
    for address in addresses:
        try:
            data = store.blobs.get_bytes(address, label=address)
            taskset = TaskSet.from_jsonl(address, data, source=address)
        except (ReprorlError, OSError, ValueError):
            continue  # the trajectory is still shown, without its prompt
        tasks.update((t.content_hash, t) for t in taskset.tasks)
    return tasks
