"""Launching a run: refuse an unpinned spec, then write the run record before step 0."""

from __future__ import annotations

from reprorl.config import RunSpec, ensure_resolved, iter_refs
from reprorl.config.limits import dotted
from reprorl.errors import ArtifactNotFoundError
from reprorl.store import RunRecord, Store


def spec_inputs(spec: RunSpec, store: Store) -> dict[str, str]:
    """Every artifact the spec uses, by the field that names it, as exact content hashes."""
    return {dotted(path): store.resolve(ref).hash for path, ref in iter_refs(spec)}


def create_run(spec: RunSpec, store: Store) -> RunRecord:
    """Record a run of `spec`: the spec must already be pinned to hashes, and each must exist."""
    ensure_resolved(spec)
    inputs = spec_inputs(spec, store)
    for role, address in inputs.items():
        if not store.blobs.has(address):
            raise ArtifactNotFoundError(f"{role}: {address} is registered but not in the blob store")
    return RunRecord.create(
        store,
        spec=spec.model_dump(mode="json"),
        spec_hash=spec.spec_hash(),
        name=spec.name,
        seeds={"root": spec.seed},
        inputs=inputs,
    )
