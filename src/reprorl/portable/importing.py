"""Importing a bundle into a store: verified whole first, then objects, names, the run and its lineage.

The bundle is extracted into the store's temp folder and checked member by member; only then is
anything stored or registered. Artifact names are kept (the run's spec pins `name@sha256:...`, so a
name is part of how it resolves) and so are version numbers, unless this store has that number of
that name for other content: then the artifact becomes the name's next version and the result says
so. The run folder is renamed into place whole, with `import.json` beside its records naming the
bundle it came from, and every imported artifact gets an `imported_from` lineage edge to the
bundle id.
"""

from __future__ import annotations

import datetime
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprorl.errors import UserInputError
from reprorl.hashing import HASH_PREFIX
from reprorl.portable.manifest import Manifest, ModelSource
from reprorl.portable.reading import BundleError, Opened, read_bundle
from reprorl.store import ArtifactVersion, RunEntry, Store
from reprorl.store.atomic import fsync_dir, write_atomic
from reprorl.store.runs import IMPORT_FILE

# The local file holding a model's exact bytes (from the package that ships them), or None.
ModelFinder = Callable[[ModelSource], Path | None]


@dataclass(frozen=True)
class Imported:
    run_id: str
    bundle_id: str
    manifest: Manifest
    signer: str | None
    artifacts: tuple[str, ...]  # name@vN as registered here
    renumbered: tuple[str, ...]  # "name v3 -> v4: v3 here is other content"
    models_from_packages: tuple[str, ...]


def import_bundle(
    store: Store, path: Path, *, find_model: ModelFinder = lambda _m: None, require_models: bool = True
) -> Imported:
    """Verify the bundle at `path` whole, then store and register its run (see the module doc).

    With `require_models` false, a base model neither in the bundle nor to be found here is left
    unregistered instead of refusing the import (for reading the records, not for training).
    """
    store.root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".import-", dir=store.root))
    try:
        opened = read_bundle(path, into=scratch)
        return _register(store, opened, scratch, find_model, require_models)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _register(
    store: Store, opened: Opened, scratch: Path, find_model: ModelFinder, require_models: bool
) -> Imported:
    manifest, run_id = opened.manifest, opened.manifest.run_id
    if (store.runs_dir / run_id).exists() or (store.has_registry() and store.registry.has_run(run_id)):
        raise UserInputError(f"run {run_id} is already in {store.root}; import it into another store")
    # Refuse before writing anything when a base model the bundle does not carry cannot be had here.
    local_models: dict[str, Path] = {}
    for model in manifest.models:
        if model.included or store.blobs.has(model.hash):
            continue
        found = find_model(model)
        if found is None and not require_models:
            continue
        if found is None:
            source = (
                f"install {model.package}=={model.package_version} (it ships these bytes) and import "
                "again, or "
                if model.package
                else ""
            )
            raise UserInputError(
                f"base model {model.name} ({model.hash}) is in neither the bundle nor {store.root}: "
                f"{source}export the run again with --with-models"
            )
        local_models[model.hash] = found

    held = [(m.path, m.sha256) for m in manifest.members] + [(d.path, d.sha256) for d in manifest.derived]
    for name, sha256 in held:
        if name.startswith("objects/"):
            address = store.blobs.put_file(scratch / name)
            assert address == HASH_PREFIX + sha256  # read_bundle checked these very bytes
    from_packages: list[str] = []
    for model in manifest.models:
        if model.hash in local_models:
            version = store.add(model.name, local_models[model.hash], kind="model")
            if version.hash != model.hash:
                raise BundleError(
                    f"{local_models[model.hash]} is not the bytes of {model.name} ({model.hash})"
                )
            from_packages.append(f"{model.name} from {model.package} {model.package_version}")

    registered, renumbered = _artifacts(store, opened.registry)
    folder = scratch / "runs" / run_id
    for rel, tree in sorted(manifest.rebuilt.items()):
        store.blobs.export_tree(tree, folder / rel, label=f"{run_id}/{rel}")
    write_atomic(
        folder / IMPORT_FILE,
        (
            json.dumps(
                {
                    "bundle": opened.bundle_id,
                    "file": opened.path.name,
                    "imported_at": datetime.datetime.now(datetime.UTC).isoformat(),
                    "renumbered": renumbered,
                    "versions": manifest.versions,
                    "versions_left_out": manifest.left_out,
                },
                indent=1,
                sort_keys=True,
            )
            + "\n"
        ).encode(),
    )
    store.runs_dir.mkdir(parents=True, exist_ok=True)
    folder.rename(store.runs_dir / run_id)
    fsync_dir(store.runs_dir)

    status = json.loads((store.runs_dir / run_id / "status.json").read_text())
    info = json.loads(opened.small[f"runs/{run_id}/run.json"])
    ended = status.get("ended_at")
    store.registry.add_run(
        RunEntry(
            run_id,
            str(info.get("name", "")),
            manifest.spec_hash,
            str(status.get("status", "created")),
            str(store.runs_dir / run_id),
            datetime.datetime.fromisoformat(str(info["created_at"])),
            datetime.datetime.fromisoformat(ended) if ended else None,
        ),
        {str(k): str(v) for k, v in opened.registry.get("inputs", {}).items()},
    )
    for edge in opened.registry.get("lineage", []):
        store.registry.link(str(edge["child"]), str(edge["parent"]), str(edge["relation"]), run_id=run_id)
    for address in sorted({v.hash for v in registered}):
        store.registry.link(address, opened.bundle_id, "imported_from", run_id=run_id)
    return Imported(
        run_id,
        opened.bundle_id,
        manifest,
        opened.signer,
        tuple(v.label for v in registered),
        tuple(renumbered),
        tuple(from_packages),
    )


def _artifacts(store: Store, registry: dict[str, Any]) -> tuple[list[ArtifactVersion], list[str]]:
    """Register each artifact row under its own version number where that is free here."""
    registered: list[ArtifactVersion] = []
    renumbered: list[str] = []
    rows = sorted(registry.get("artifacts", []), key=lambda r: (str(r["name"]), int(r["version"])))
    for row in rows:
        wanted = ArtifactVersion(
            name=str(row["name"]),
            version=int(row["version"]),
            hash=str(row["hash"]),
            kind=str(row["kind"]),
            size=int(row["size"]),
            created_at=datetime.datetime.fromisoformat(str(row["created_at"])),
            meta=dict(row.get("meta") or {}),
        )
        if not store.blobs.has(wanted.hash):
            continue  # a model left out of the bundle and not here: refused above unless found
        same = [v for v in store.registry.versions(wanted.name) if v.hash == wanted.hash]
        if same:
            registered.append(same[-1])
            if wanted.version not in {v.version for v in same}:
                renumbered.append(
                    f"{wanted.name} v{wanted.version} is v{same[-1].version} here (same content)"
                )
            continue
        adopted = store.registry.adopt(wanted)
        if adopted is None:
            adopted = store.registry.register(
                wanted.name, wanted.hash, kind=wanted.kind, size=wanted.size, meta=wanted.meta
            )
            renumbered.append(
                f"{wanted.name} v{wanted.version} -> v{adopted.version}: "
                f"v{wanted.version} here is other content"
            )
        registered.append(adopted)
    return registered, renumbered
