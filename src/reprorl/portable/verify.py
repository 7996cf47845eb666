"""Verifying a bundle without importing it: every member checked, then the audit answered from it alone."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from reprorl.audit.audit import AuditReport, audit_run
from reprorl.portable.importing import ModelFinder, import_bundle
from reprorl.portable.manifest import Manifest
from reprorl.store import Store


@dataclass(frozen=True)
class Verified:
    bundle_id: str
    manifest: Manifest
    audit: AuditReport
    signer: str | None  # the public key that signed the manifest, when signed


def verify_bundle(path: Path, *, find_model: ModelFinder = lambda _m: None) -> Verified:
    """Check every member of the bundle, then answer the audit's questions from a scratch store
    holding only what the bundle carries (and a base model this machine's package ships, if the
    bundle left it out)."""
    with tempfile.TemporaryDirectory(prefix="reprorl-verify-") as scratch:
        store = Store(Path(scratch) / "home")
        try:
            imported = import_bundle(store, path, find_model=find_model, require_models=False)
            report = audit_run(store, imported.run_id)
        finally:
            store.close()
    return Verified(imported.bundle_id, imported.manifest, report, imported.signer)
