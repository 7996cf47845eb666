"""Exporting a run: its records, the artifacts it used and made, and its code state, as one bundle file.

Everything is streamed from disk into the tar and hashed on the way, so a run of any size is
exported in bounded memory; the file appears under its final name only once it is whole.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from reprorl.errors import IntegrityError, UserInputError
from reprorl.hashing import HASH_PREFIX, canonical_json, sha256_hex
from reprorl.portable.derive import DERIVE_MAX_BYTES, TRANSFORMS
from reprorl.portable.manifest import (
    ID_IN_NAME,
    MANIFEST,
    REGISTRY,
    SIGNATURE,
    Derived,
    HashingReader,
    Manifest,
    Member,
    ModelSource,
    VersionsCarried,
    safe_member_path,
)
from reprorl.portable.signing import load_key, sign, signer_id
from reprorl.store import ArtifactVersion, RunRecord, Store, read_log
from reprorl.store.atomic import fsync_dir
from reprorl.store.blobs import file_hash, tree_hash
from reprorl.store.runs import VERSIONS_FILE

CHECKPOINTS_DIR = "checkpoints"
UNTRACKED_MAX_BYTES = 16 << 20  # per file: a data file left untracked is not code
# (package, version) that ships a model's exact bytes, or None: given by the policy layer.
ModelPackage = Callable[[str], tuple[str, str] | None]


@dataclass(frozen=True)
class Exported:
    bundle_id: str
    path: Path
    size: int
    members: int
    models: tuple[ModelSource, ...]
    notes: tuple[str, ...]
    signer: str | None
    left_out: tuple[str, ...]  # kept policy versions whose tensors the bundle does not carry
    derived: int  # files written on reading from a member they re-encode (carried once)


def export_bundle(
    store: Store,
    run_id: str,
    out: Path,
    *,
    with_models: bool = False,
    checkpoints: bool = False,
    policy_versions: VersionsCarried = "ends",
    model_package: ModelPackage = lambda _hash: None,
    sign_with: Path | None = None,
) -> Exported:
    """Write the bundle of `run_id` to `out` (atomically: a temp file renamed at the end)."""
    key = load_key(sign_with) if sign_with is not None else None  # a bad key fails before any work
    record = RunRecord(store, run_id)
    info = record.info()  # verifies spec.json and run.json against their checksums first
    out = Path(out)
    folder = out if out.is_dir() else out.parent  # a folder: named `<run id>-<id prefix>.tar` in it
    versions = _artifacts(store, run_id, info)
    models = [_model(v, with_models, model_package) for v in versions if v.kind == "model"]
    shipped = {v.hash for v in versions if v.kind != "model" or with_models}
    kept, left_out = _kept_versions(record, policy_versions)  # tensors of versions, for replay
    derivable = _derivable(store, kept)
    rebuilt = _stored_folders(record.path, shipped)
    notes: list[str] = []
    members: list[Member] = []
    derived: list[Derived] = []
    folder.mkdir(parents=True, exist_ok=True)
    staging = folder / f".tmp-{run_id}-{os.getpid()}.tar"
    try:
        with staging.open("wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, path in _run_files(record.path, checkpoints, set(rebuilt)):
                name = f"runs/{run_id}/{rel}"
                if path.stat().st_size in {size for _, size, _ in derivable.values()}:
                    digest = file_hash(path).removeprefix(HASH_PREFIX)
                    if digest in derivable:
                        derived.append(_derived(name, digest, derivable[digest]))
                        continue
                members.append(_add_file(tar, name, path))
            for address in sorted(_objects(store, shipped) | kept):
                digest = address.removeprefix(HASH_PREFIX)
                if digest in derivable and address not in kept:
                    derived.append(_derived(f"objects/{digest}", digest, derivable[digest]))
                    continue
                member = _add_file(tar, f"objects/{digest}", store.blobs.path_of(address, verify=False))
                if member.sha256 != digest:
                    raise IntegrityError(
                        f"object {address} in {store.root} no longer matches its hash; run `reprorl fsck`",
                        artifact=address,
                        expected=address,
                        actual=HASH_PREFIX + member.sha256,
                    )
                members.append(member)
            for name, path in _untracked(info, notes):
                members.append(_add_file(tar, name, path))
            registry = _registry_json(store, run_id, versions, shipped)
            members.append(_add_bytes(tar, REGISTRY, registry))
            manifest = Manifest(
                run_id=run_id,
                spec_hash=str(info["spec_hash"]),
                created_at=datetime.datetime.now(datetime.UTC).isoformat(),
                checkpoints=checkpoints,
                versions=policy_versions,
                left_out=left_out,
                derived=derived,
                rebuilt=rebuilt,
                notes=notes,
                models=models,
                members=members,
            )
            _add_bytes(tar, MANIFEST, manifest.to_bytes())
            if key is not None:
                _add_bytes(tar, SIGNATURE, sign(manifest.to_bytes(), key))
            raw.flush()
            os.fsync(raw.fileno())
        if out.is_dir():
            out = out / f"{run_id}-{manifest.bundle_id().removeprefix(HASH_PREFIX)[:ID_IN_NAME]}.tar"
        staging.replace(out)
        fsync_dir(folder)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return Exported(
        manifest.bundle_id(),
        out,
        out.stat().st_size,
        len(members) + 1,
        tuple(models),
        tuple(notes),
        signer_id(key.public_key()) if key is not None else None,
        tuple(left_out),
        len(derived),
    )


def _artifacts(store: Store, run_id: str, info: dict[str, Any]) -> list[ArtifactVersion]:
    """Every registered version of what the run used (its pinned inputs) or made (its outputs)."""
    wanted = {str(a) for a in info.get("inputs", {}).values()}
    wanted |= set(store.registry.run_artifacts(run_id).values())
    for child, parent, _relation in store.registry.made_by_run(run_id):
        wanted |= {child, parent}
    everything = store.registry.versions()
    made = {v.hash for v in everything if v.meta.get("run_id") == run_id}
    return [v for v in everything if v.hash in wanted | made]


def _kept_versions(record: RunRecord, which: VersionsCarried) -> tuple[set[str], list[str]]:
    """The tensors of the kept policy versions `which` carries (`ends`: the versions first sampled
    at the run's first and last step), and the versions it leaves out."""
    lines = [x for x in read_log(record.path / VERSIONS_FILE).records if isinstance(x.get("tensors"), str)]
    lines.sort(key=lambda x: int(x.get("first_step", 0)))
    chosen = {"all": lines, "ends": lines[:1] + lines[-1:], "none": []}[which]
    carried = {str(x["tensors"]) for x in chosen}
    left_out = sorted({str(x["policy_version"]) for x in lines if str(x["tensors"]) not in carried})
    return carried, left_out


# sha256 hex of a derivable file -> (the member it derives from, its size, the transform)
Derivable = dict[str, tuple[str, int, str]]


def _derivable(store: Store, sources: set[str]) -> Derivable:
    """What each registered transform makes of each carried version's tensors."""
    found: Derivable = {}
    for address in sorted(sources):
        path = store.blobs.path_of(address, verify=False)
        if path.stat().st_size > DERIVE_MAX_BYTES:
            continue
        data = path.read_bytes()
        for name, fn in sorted(TRANSFORMS.items()):
            made = fn(data)
            if made is not None:
                source = f"objects/{address.removeprefix(HASH_PREFIX)}"
                found.setdefault(sha256_hex(made), (source, len(made), name))
    return found


def _derived(name: str, digest: str, how: tuple[str, int, str]) -> Derived:
    source, size, transform = how
    return Derived(path=name, sha256=digest, size=size, source=source, transform=transform)


def _stored_folders(folder: Path, shipped: set[str]) -> dict[str, str]:
    """The run folder's subfolders that a shipped tree holds byte for byte (the saved adapters):
    carried once, as store objects, and written back from them on import."""
    found: dict[str, str] = {}
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if sub.name == CHECKPOINTS_DIR or not any(sub.iterdir()):
            continue
        with contextlib.suppress(UserInputError):  # a link or special file: carried as it is
            address = tree_hash(sub)
            if address in shipped:
                found[sub.name] = address
    return found


def _model(version: ArtifactVersion, included: bool, package_of: ModelPackage) -> ModelSource:
    package = package_of(version.hash)
    return ModelSource(
        name=version.name,
        version=version.version,
        hash=version.hash,
        size=version.size,
        included=included,
        package=package[0] if package else None,
        package_version=package[1] if package else None,
    )


def _objects(store: Store, addresses: set[str]) -> set[str]:
    """The store objects behind `addresses`: a tree's manifest and every file it lists."""
    found: set[str] = set()
    for address in addresses:
        found.add(address)
        if store.blobs.is_tree(address):
            found |= {str(e["hash"]) for e in store.blobs.read_tree(address)["entries"]}
    return found


def _run_files(folder: Path, checkpoints: bool, skipped: set[str]) -> Iterator[tuple[str, Path]]:
    """The run folder's files, sorted; temp files and (unless asked for) checkpoints left out."""
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        top = rel.split("/", 1)[0]
        if not path.is_file() or path.is_symlink() or top in skipped:
            continue
        if any(part.startswith(".") for part in rel.split("/")):
            continue  # staging and temp files of a writer, never part of the record
        if top == CHECKPOINTS_DIR and not checkpoints:
            continue
        yield rel, path


def _untracked(info: dict[str, Any], notes: list[str]) -> Iterator[tuple[str, Path]]:
    """The untracked files the run's code state names, as they are now (the record names them; it
    does not hold their bytes), under `code/untracked/<which checkout>/<path>`."""
    for which, state in sorted((info.get("environment", {}).get("code") or {}).items()):
        if not state:
            continue
        root = Path(str(state.get("root", "")))
        for rel in state.get("untracked", []):
            path = root / rel
            name = f"code/untracked/{which}/{rel}"
            if not path.is_file() or path.is_symlink():
                notes.append(f"untracked {rel!r} in {which}: not a regular file now, not included")
            elif path.stat().st_size > UNTRACKED_MAX_BYTES:
                notes.append(
                    f"untracked {rel!r} in {which}: over {UNTRACKED_MAX_BYTES >> 20} MiB, not included"
                )
            elif not safe_member_path(name):
                notes.append(f"untracked {rel!r} in {which}: a name a bundle cannot hold, not included")
            else:
                yield name, path


def _registry_json(store: Store, run_id: str, versions: list[ArtifactVersion], shipped: set[str]) -> bytes:
    entry = next((r for r in store.registry.runs() if r.run_id == run_id), None)
    value = {
        "artifacts": [
            {
                "name": v.name,
                "version": v.version,
                "hash": v.hash,
                "kind": v.kind,
                "size": v.size,
                "created_at": v.created_at.isoformat(),
                "meta": v.meta,
                "included": v.hash in shipped,
            }
            for v in versions
        ],
        "lineage": [
            {"child": c, "parent": p, "relation": r} for c, p, r in store.registry.made_by_run(run_id)
        ],
        "run": None
        if entry is None
        else {"name": entry.name, "status": entry.status, "created_at": entry.created_at.isoformat()},
        "inputs": store.registry.run_artifacts(run_id),
    }
    return (canonical_json(value) + "\n").encode()


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    # Fixed owner, mode and time: the same records make the same bytes, wherever exported.
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uname, info.gname = size, 0o644, 0, "", ""
    return info


def _add_file(tar: tarfile.TarFile, name: str, path: Path) -> Member:
    if not safe_member_path(name):
        raise UserInputError(f"{path} cannot go into a bundle: its name {name!r} is not portable")
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size  # a log still growing is taken as it was here
        reader = HashingReader(handle)
        tar.addfile(_tarinfo(name, size), cast(IO[bytes], _Exactly(reader, size)))
    return Member(path=name, sha256=reader.hexdigest(), size=size)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> Member:
    reader = HashingReader(io.BytesIO(data))
    tar.addfile(_tarinfo(name, len(data)), cast(IO[bytes], reader))
    return Member(path=name, sha256=reader.hexdigest(), size=len(data))


class _Exactly:
    """`size` bytes of `reader` and no more (a file that grew after its size was taken)."""

    def __init__(self, reader: HashingReader, size: int) -> None:
        self.reader, self.left = reader, size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.reader.read(n)
        self.left -= len(data)
        return data
