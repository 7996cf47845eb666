"""The kept policy versions: the trained tensors of every version a run sampled from, so any rollout replays.

A rollout records the `policy_version` of each turn (`adapter:<sha256>` of the trained tensors). The
run keeps those tensors in the store's content-addressed blobs (safetensors bytes, so identical
versions are stored once) and maps each version to its blob in `runs/<id>/versions.jsonl`, one
checksummed line per version. A LoRA adapter's tensors are small; full fine-tuning keeps no version
per step (every weight, each time) and says so in the same file: its versions that a checkpoint
holds (`checkpoints/step-N/`, as many as `learning.keep_checkpoints` keeps) load from there.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import load_file
from safetensors.torch import save as save_tensors

from reprorl.errors import ArtifactNotFoundError, IntegrityError, RecordError
from reprorl.hashing import HASH_PREFIX
from reprorl.orchestrate.run.checkpoint import STEP_PREFIX, checkpoints_root, verify_checkpoint
from reprorl.policy import tensors_hash
from reprorl.store import RunRecord, read_log
from reprorl.store.atomic import append_durable
from reprorl.store.runs import IMPORT_FILE, VERSIONS_FILE, checksummed_line
from reprorl.trainer.local import STATE_WEIGHTS

KINDS_KEPT = ("adapter",)


FULL_WHY = "full fine-tuning keeps every weight only in its checkpoints"


class GoneError(RecordError):
    """A version's tensors are not in this store (never kept, or their blob was removed).

    `why` is set when that is by design, not damage: the run never meant to keep them (full
    fine-tuning, no checkpoint of the version), or the bundle it was imported from left them out."""

    def __init__(self, message: str, *, why: str | None = None) -> None:
        super().__init__(message)
        self.why = why

    @property
    def by_design(self) -> bool:
        return self.why is not None


def kept_lines(record: RunRecord) -> dict[str, dict[str, object]]:
    """What the run kept of each version it sampled from (its first step, its tensors), by version."""
    return {
        str(line["policy_version"]): line
        for line in read_log(record.path / VERSIONS_FILE).records
        if "policy_version" in line
    }


class VersionKeeper:
    """Keeps each version the run publishes for sampling, once."""

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        self.path: Path = record.path / VERSIONS_FILE
        self._kept = set(kept_lines(record))

    def keep(self, version: str, tensors: dict[str, torch.Tensor], *, step: int) -> None:
        """Store `tensors` as `version` (their `kind:hash`), unless this run already has."""
        if version in self._kept:
            return
        kind = version.partition(":")[0]
        line: dict[str, object] = {"policy_version": version, "first_step": step}
        if kind in KINDS_KEPT:
            plain = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
            data = save_tensors(dict(sorted(plain.items())))
            line |= {"tensors": self.record.store.blobs.put_bytes(data), "bytes": len(data)}
        else:
            line |= {"tensors": None, "why": FULL_WHY}
        append_durable(self.path, checksummed_line(line))
        self._kept.add(version)


def kept_tensors(record: RunRecord, version: str) -> dict[str, torch.Tensor]:
    """The tensors of `version`, checked against its hash; `GoneError`, saying why, when they are gone."""
    line = kept_lines(record).get(version)
    if line is None:
        raise GoneError(f"run {record.run_id} kept no weights for {version} ({VERSIONS_FILE} has no entry)")
    address = line.get("tensors")
    if isinstance(address, str):
        try:
            data = record.store.blobs.get_bytes(address, label=version)
        except ArtifactNotFoundError as exc:
            why = _left_out_by_bundle(record, version)
            raise GoneError(
                f"the weights of {version} ({address}) are {why or 'no longer in this store'}", why=why
            ) from exc
        tensors = load_tensors(data)
    else:
        tensors = _checkpointed(record, version, str(line.get("why", "none stored")))
    actual = f"{version.partition(':')[0]}:{tensors_hash(tensors)}"
    if actual != version:
        raise IntegrityError(
            f"the weights kept for {version} hash to {actual}",
            artifact=version,
            expected=version,
            actual=actual,
        )
    return tensors


def _checkpointed(record: RunRecord, version: str, why: str) -> dict[str, torch.Tensor]:
    """The trained tensors of `version` from the run's checkpoint that holds it."""
    root = checkpoints_root(record)
    folders = sorted(root.glob(f"{STEP_PREFIX}*")) if root.is_dir() else []
    for folder in folders:
        try:
            state = verify_checkpoint(folder)
        except RecordError:
            continue
        if state.policy_version == version:
            saved = load_file(str(folder / STATE_WEIGHTS))
            return {k.removeprefix("param/"): t for k, t in saved.items() if k.startswith("param/")}
    kept = ", ".join(f.name for f in folders) or "none"
    raise GoneError(
        f"run {record.run_id} kept no weights for {version}: {why}, and none holds it (kept: {kept})",
        why=f"were never kept ({why})",
    )


def _left_out_by_bundle(record: RunRecord, version: str) -> str | None:
    """Why `version`'s tensors are missing when the bundle this run was imported from left them out."""
    try:
        imported = json.loads((record.path / IMPORT_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(imported, dict) or version not in imported.get("versions_left_out", []):
        return None
    bundle = str(imported.get("bundle", "?")).removeprefix(HASH_PREFIX)[:12]
    return (
        f"left out of bundle {bundle} (exported with --versions {imported.get('versions')}; "
        "`reprorl reproduce --bundle` trains them again)"
    )
