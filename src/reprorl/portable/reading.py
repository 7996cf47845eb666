"""Reading a bundle: one streamed pass that checks every member against the manifest, extracting too.

Nothing in a bundle is trusted before the pass ends: a member whose bytes differ from their listed
sha256 (one flipped byte), a listed member that is missing, a member the manifest does not list, a
path that would leave the extraction folder, a link or device, and a manifest that disagrees with
the records it lists are each refused with one line naming them. Where `into` is given, members are
written there as they are read and the caller registers nothing until the pass has succeeded.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from reprorl.errors import StoreError
from reprorl.hashing import HASH_PREFIX, sha256_hex
from reprorl.portable.derive import DERIVE_MAX_BYTES, TRANSFORMS
from reprorl.portable.manifest import (
    MANIFEST,
    REGISTRY,
    SIGNATURE,
    HashingReader,
    Manifest,
    chunks,
    describe,
    id_in_name,
    safe_member_path,
)
from reprorl.portable.signing import SignatureError, check


class BundleError(StoreError):
    """A bundle is damaged, incomplete or not a bundle; the message names the member."""


@dataclass
class Opened:
    """A bundle whose every member matched its manifest."""

    path: Path
    manifest: Manifest
    bundle_id: str
    registry: dict[str, Any]
    signer: str | None = None  # the key that signed the manifest, when the bundle is signed
    small: dict[str, bytes] = field(default_factory=dict)  # the run's JSON records, kept for checks


# Run records small enough to keep in memory while streaming, for the cross-checks.
_KEPT = ("run.json", "spec.json", "checksums.json", "status.json")
SMALL_MAX_BYTES = 256 << 20  # a manifest of a million part files is a fraction of this


def read_bundle(path: Path, into: Path | None = None) -> Opened:
    """Check (and, with `into`, extract) the bundle at `path`; raise BundleError naming what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise BundleError(f"{path}: no such bundle file")
    seen: dict[str, tuple[str, int]] = {}
    manifest_bytes: bytes | None = None
    signature: bytes | None = None
    small: dict[str, bytes] = {}
    try:
        with tarfile.open(path, mode="r|") as tar:  # a stream: members are never indexed in memory
            for info in tar:
                name = info.name
                if manifest_bytes is not None and name != SIGNATURE:
                    raise BundleError(f"{path}: member {name!r} comes after the manifest")
                if not info.isreg():
                    raise BundleError(f"{path}: member {name!r} is not a regular file (a link or device?)")
                if not safe_member_path(name):
                    raise BundleError(f"{path}: member {name!r} has a path that leaves the bundle")
                if name in seen or name in small:
                    raise BundleError(f"{path}: member {name!r} appears twice")
                handle = tar.extractfile(info)
                assert handle is not None  # a regular file always has contents
                if _kept(name):
                    if info.size > SMALL_MAX_BYTES:
                        raise BundleError(f"{path}: member {name!r} is {info.size:,} bytes, not a record")
                    data = handle.read()
                    small[name] = data
                    if name == MANIFEST:
                        manifest_bytes = data
                        continue
                    if name == SIGNATURE:
                        signature = data
                        continue
                    digest, size = sha256_hex(data), len(data)
                    if into is not None:
                        _write(path, into, name, [data])
                else:
                    reader = HashingReader(handle)
                    if into is None:
                        for _ in chunks(reader):
                            pass
                    else:
                        _write(path, into, name, chunks(reader))
                    digest, size = reader.hexdigest(), reader.size
                seen[name] = (digest, size)
                # A stream keeps every header it read (an undeclared attribute); a run's parts need not.
                tar.members = []  # type: ignore[attr-defined]
    except tarfile.TarError as exc:
        raise BundleError(
            f"{path}: not a readable tar ({describe(exc)}); the file is cut short or not a bundle"
        ) from None
    if manifest_bytes is None:
        raise BundleError(f"{path}: {MANIFEST} is missing (the file is cut short or not a bundle)")
    manifest = _parse_manifest(path, manifest_bytes)
    named = id_in_name(path.name)
    if named is not None and not manifest.bundle_id().removeprefix(HASH_PREFIX).startswith(named):
        raise BundleError(
            f"{path}: {MANIFEST} was edited: the bundle id is no longer the {named} its file name carries"
        )
    _check_members(path, manifest, seen)
    _derive(path, manifest, into)
    registry = _parse_json(path, REGISTRY, small.get(REGISTRY))
    _check_records(path, manifest, small, registry)
    signer = None
    if signature is not None:
        try:
            signer = check(manifest_bytes, signature)
        except SignatureError as exc:
            raise BundleError(f"{path}: member {SIGNATURE!r}: {exc}") from None
    return Opened(path, manifest, manifest.bundle_id(), registry, signer, small)


def _kept(name: str) -> bool:
    """A member read whole for the cross-checks: the manifest, signature, registry rows, and the
    run folder's small JSON records (`runs/<id>/<record>`)."""
    if name in (MANIFEST, SIGNATURE, REGISTRY):
        return True
    parts = name.split("/")
    return len(parts) == 3 and parts[0] == "runs" and parts[2] in _KEPT


def _write(path: Path, into: Path, name: str, data: Any) -> None:
    target = into / name
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as out:
            for chunk in data:
                out.write(chunk)
    except (NotADirectoryError, IsADirectoryError, FileExistsError):
        raise BundleError(f"{path}: member {name!r} collides with another member's folder") from None


def _parse_manifest(path: Path, data: bytes) -> Manifest:
    try:
        manifest = Manifest.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BundleError(f"{path}: {MANIFEST} is not a valid manifest ({where}: {first['msg']})") from None
    if manifest.to_bytes() != data:
        raise BundleError(f"{path}: {MANIFEST} was edited (it is not the canonical form the exporter wrote)")
    return manifest


def _parse_json(path: Path, name: str, data: bytes | None) -> dict[str, Any]:
    try:
        value = json.loads(data or b"")
    except ValueError:
        raise BundleError(f"{path}: member {name!r} is not JSON") from None
    if not isinstance(value, dict):
        raise BundleError(f"{path}: member {name!r} is not a JSON object")
    return value


def _check_members(path: Path, manifest: Manifest, seen: dict[str, tuple[str, int]]) -> None:
    listed = {m.path: m for m in manifest.members}
    if len(listed) != len(manifest.members):
        raise BundleError(f"{path}: {MANIFEST} lists a member twice")
    for member in manifest.members:
        if member.path not in seen:
            raise BundleError(f"{path}: member {member.path!r}, listed in {MANIFEST}, is missing")
        digest, size = seen[member.path]
        if (digest, size) != (member.sha256, member.size):
            raise BundleError(f"{path}: member {member.path!r} does not match its sha256 in {MANIFEST}")
        if member.path.startswith("objects/") and member.path != f"objects/{digest}":
            raise BundleError(f"{path}: member {member.path!r} is not named by its own sha256")
    for name in seen:
        if name not in listed:
            raise BundleError(f"{path}: member {name!r} is not listed in {MANIFEST}")


def _check_records(path: Path, manifest: Manifest, small: dict[str, bytes], registry: dict[str, Any]) -> None:
    """The manifest's claims against the records it carries, and the records' own checksums."""
    folder = f"runs/{manifest.run_id}/"
    info = _parse_json(path, folder + "run.json", small.get(folder + "run.json"))
    if info.get("run_id") != manifest.run_id:
        raise BundleError(
            f"{path}: {MANIFEST} names run {manifest.run_id}, its run.json {info.get('run_id')}"
        )
    if info.get("spec_hash") != manifest.spec_hash:
        raise BundleError(
            f"{path}: {MANIFEST} gives spec hash {manifest.spec_hash}, run.json {info.get('spec_hash')}"
        )
    sums = _parse_json(path, folder + "checksums.json", small.get(folder + "checksums.json"))
    for name, expected in sorted(sums.items()):
        data = small.get(folder + name)
        if data is None or sha256_hex(data) != expected:
            raise BundleError(f"{path}: record {folder + name} does not match the run's checksums.json")
    shipped = {
        p.removeprefix("objects/")
        for p in [*(m.path for m in manifest.members), *(d.path for d in manifest.derived)]
        if p.startswith("objects/")
    }
    for model in manifest.models:
        there = model.hash.removeprefix(HASH_PREFIX) in shipped
        if model.included != there:
            said = "included" if model.included else "left out"
            raise BundleError(
                f"{path}: {MANIFEST} says model {model.name} is {said}; its object is "
                f"{'there' if there else 'not there'}"
            )
    for folder_path, tree in sorted(manifest.rebuilt.items()):
        if tree.removeprefix(HASH_PREFIX) not in shipped:
            raise BundleError(f"{path}: {MANIFEST} rebuilds {folder_path!r} from {tree}, which is not there")
    for row in registry.get("artifacts", []):
        if row.get("included") and str(row.get("hash", "")).removeprefix(HASH_PREFIX) not in shipped:
            what = f"{row.get('name')}@v{row.get('version')}"
            raise BundleError(f"{path}: {REGISTRY} lists {what} as included; its object is not there")


def _derive(path: Path, manifest: Manifest, into: Path | None) -> None:
    """Make each derived member from its (already checked) source and check it against its sha256;
    with `into`, write it there. Without `into`, the sources are read again in a second pass."""
    if not manifest.derived:
        return
    listed = {m.path: m for m in manifest.members}
    for derived in manifest.derived:
        name = derived.path
        if name in listed or not safe_member_path(name):
            raise BundleError(f"{path}: derived member {name!r} is also a member, or leaves the bundle")
        origin = listed.get(derived.source)
        if origin is None or origin.size > DERIVE_MAX_BYTES:
            raise BundleError(f"{path}: derived member {name!r} comes from {derived.source!r}, not a member")
        if derived.transform not in TRANSFORMS:
            raise BundleError(
                f"{path}: derived member {name!r} names an unknown transform {derived.transform!r}"
            )
    for source, data in _sources(path, {d.source for d in manifest.derived}, into):
        if sha256_hex(data) != listed[source].sha256:
            raise BundleError(f"{path}: member {source!r} changed while it was read")
        for derived in (d for d in manifest.derived if d.source == source):
            made = TRANSFORMS[derived.transform](data)
            if made is None or (sha256_hex(made), len(made)) != (derived.sha256, derived.size):
                raise BundleError(
                    f"{path}: derived member {derived.path!r} (from {source!r}) does not match its "
                    f"sha256 in {MANIFEST}"
                )
            if into is not None:
                _write(path, into, derived.path, [made])


def _sources(path: Path, wanted: set[str], into: Path | None) -> Iterator[tuple[str, bytes]]:
    """Each wanted member's bytes, one at a time: from the extraction folder, or a second stream."""
    if into is not None:
        for name in sorted(wanted):
            yield name, (into / name).read_bytes()
        return
    with tarfile.open(path, mode="r|") as tar:
        for info in tar:
            if info.name in wanted:
                handle = tar.extractfile(info)
                assert handle is not None  # checked a regular file in the first pass
                yield info.name, handle.read()
            tar.members = []  # type: ignore[attr-defined]
