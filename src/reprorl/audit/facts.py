"""Audit facts: one run's records, each read once and kept even when it is damaged or missing.

The audit answers every question it can from whatever survived, so a missing or altered record is
loaded as an error message in place of its content instead of stopping the audit. Integrity (the
checksums of `run.json` and `spec.json`, the log line checksums) is judged by the recreate question;
the other questions read the documents as they are on disk.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from reprorl.config import RunSpec
from reprorl.config.load import stored_spec
from reprorl.errors import ArtifactNotFoundError, ReprorlError
from reprorl.hashing import HASH_PREFIX
from reprorl.refs import parse_ref
from reprorl.store import RunRecord, Store
from reprorl.store.documents import json_doc, plain_row
from reprorl.store.rollout_query import RolloutStore
from reprorl.store.runs import LogReadResult
from reprorl.types import Split, TaskSet, outcome_success

ROLLOUT_COLUMNS = (
    "rollout_id",
    "split",
    "step",
    "task_id",
    "task_hash",
    "env_version",
    "tool_versions",
    "base_model_hash",
    "adapter_version",
    "policy_version",
    "termination",
    "error",
    "retried",
    "reward_total",
    "reward_components",
    "verifier_version",
)


def short(address: str | None) -> str:
    """A hash as evidence text: enough hex to find it, not the whole line."""
    if not address:
        return "(none)"
    return address[: len(HASH_PREFIX) + 12] + "…" if address.startswith(HASH_PREFIX) else address


def pinned_hash(ref: str) -> str | None:
    """The full `sha256:<hex>` a reference is pinned to, or None for a version number or a prefix."""
    try:
        parsed = parse_ref(ref)
    except ReprorlError:
        return None
    return f"{HASH_PREFIX}{parsed.digest}" if parsed.is_pinned else None


@dataclass
class Finding:
    """What one question found: records that prove it, records that are missing, and caveats."""

    evidence: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def ok(self, text: str) -> None:
        self.evidence.append(text)

    def fail(self, text: str) -> None:
        self.missing.append(text)

    def note(self, text: str) -> None:
        self.notes.append(text)


@dataclass
class RunFacts:
    """Every record of one run an audit reads, loaded tolerantly (content or the error met)."""

    store: Store
    record: RunRecord
    info: dict[str, Any] | None
    info_error: str | None
    spec_doc: dict[str, Any] | None
    spec_error: str | None
    status: dict[str, Any] | None
    events: LogReadResult
    metrics: LogReadResult
    rollouts: list[dict[str, Any]] | None
    rollouts_error: str | None
    rollout_parts: int = 0
    unkept_versions: set[str] = field(default_factory=set)  # policy versions the run never kept
    _tasksets: dict[str, TaskSet] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, store: Store, record: RunRecord) -> RunFacts:
        info, info_error = json_doc(record.path / "run.json")
        spec_doc, spec_error = json_doc(record.path / "spec.json")
        status, _ = json_doc(record.path / "status.json")
        events = record.events()
        if status is None:
            # status.json is rewritten in place; each change of status is also an event.
            changes = [e for e in events.records if e.get("event") == "status"]
            status = {"status": changes[-1].get("status"), "from_event": True} if changes else None
        rollouts: list[dict[str, Any]] | None = None
        rollouts_error, parts = None, 0
        try:
            reader = RolloutStore(record)
            parts = len(reader.parts())
            rollouts = [plain_row(row) for row in reader.query(columns=ROLLOUT_COLUMNS).to_pylist()]
        except (ReprorlError, OSError) as exc:
            rollouts_error = str(exc)
        return cls(
            store,
            record,
            info,
            info_error,
            spec_doc,
            spec_error,
            status,
            events,
            record.metrics(),
            rollouts,
            rollouts_error,
            parts,
        )

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def path(self) -> Path:
        return self.record.path

    @property
    def inputs(self) -> dict[str, str]:
        found = (self.info or {}).get("inputs")
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}

    @cached_property
    def spec_or_error(self) -> tuple[RunSpec | None, str]:
        if self.spec_doc is None:
            return None, f"spec.json cannot be read ({self.spec_error})"
        try:
            return stored_spec(self.spec_doc), ""
        except ReprorlError as exc:
            return None, f"spec.json does not validate as a run spec: {exc}"

    def need_spec(self, out: Finding) -> RunSpec | None:
        """The validated spec; records the failure on `out` when there is none."""
        spec, error = self.spec_or_error
        if spec is None:
            out.fail(error)
        return spec

    def events_named(self, *kinds: str) -> list[dict[str, Any]]:
        return [e for e in self.events.records if e.get("event") in kinds]

    def train_steps(self) -> list[dict[str, Any]]:
        """Metric lines of policy-gradient steps (SFT and eval lines carry a `stage`)."""
        return [m for m in self.metrics.records if m.get("stage") is None]

    def eval_points(self) -> list[dict[str, Any]]:
        return [m for m in self.metrics.records if m.get("stage") == "eval"]

    def label(self, address: str) -> str:
        """`name@vN` when the registry knows the hash, else the short hash."""
        if self.store.has_registry():
            try:
                return self.store.registry.lookup(None, digest=address.removeprefix(HASH_PREFIX)).label
            except ReprorlError:
                pass
        return short(address)

    def taskset(self, address: str) -> TaskSet:
        """A stored task set, verified against its address (raises when missing or corrupt)."""
        if address not in self._tasksets:
            label = self.label(address)
            data = self.store.blobs.get_bytes(address, label=label)
            self._tasksets[address] = TaskSet.from_jsonl(label, data, source=label)
        return self._tasksets[address]

    @cached_property
    def families(self) -> tuple[dict[str, str], bool]:
        """Task hash → env family over the run's pinned task sets, and whether every one was read."""
        families: dict[str, str] = {}
        addresses = {v for k, v in self.inputs.items() if k == "data.train" or k.startswith("evaluation.")}
        complete = bool(addresses)
        for address in addresses:
            try:
                families.update((t.content_hash, t.family) for t in self.taskset(address).tasks)
            except (ReprorlError, ValueError):
                complete = False  # the question that owns the task set reports it
        return families, complete

    @property
    def family_of(self) -> dict[str, str]:
        return self.families[0]


def succeeded(row: dict[str, Any]) -> bool:
    total = row.get("reward_total")
    return total is not None and outcome_success(float(total), row.get("reward_components") or {})


def held_out(taskset: TaskSet) -> tuple[Any, ...]:
    return taskset.split(Split.EVAL) + taskset.split(Split.HOLDOUT)


def verify_artifact(store: Store, address: str, label: str) -> str:
    """Re-hash a stored file or every file of a stored folder; raises when one is missing or corrupt."""
    blobs = store.blobs
    if not blobs.has(address):
        raise ArtifactNotFoundError(f"{label}: object {short(address)} is not in the blob store")
    if not blobs.is_tree(address):
        blobs.verify(address, label=label)
        return "a file whose bytes hash to its address"
    entries = blobs.read_tree(address, label=label)["entries"]
    for entry in entries:
        blobs.verify(entry["hash"], label=f"{label}/{entry['path']}")
    size = sum(int(e["size"]) for e in entries)
    return f"a folder of {len(entries)} files ({size:,} bytes), each hashing to its address"


def missing_objects(store: Store, address: str) -> list[str]:
    """Objects of an artifact that are not in the blob store (a folder's manifest and its files)."""
    blobs = store.blobs
    if not blobs.has(address):
        return [address]
    try:
        if not blobs.is_tree(address):
            return []
        entries: Iterable[dict[str, Any]] = blobs.read_tree(address)["entries"]
    except ReprorlError:
        return [address]
    return [str(e["hash"]) for e in entries if not blobs.has(str(e["hash"]))]
