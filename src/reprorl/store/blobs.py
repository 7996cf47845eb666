"""The content-addressed blob store: bytes and directory trees kept under their sha256.

A blob lives at `objects/<2 hex>/<62 hex>` and is read-only. A directory is stored as one blob per
file plus a manifest blob (canonical JSON of relative paths, hashes, sizes and exec bits); the
manifest's hash is the directory's hash. Writes go through a temp file and a rename, so a killed
writer never leaves a partial object under a real address; every read re-hashes what it returns.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from reprorl.errors import ArtifactNotFoundError, IntegrityError, StoreError, UserInputError
from reprorl.hashing import HASH_PREFIX, canonical_json, is_full_hash
from reprorl.store.atomic import atomic_writer, fsync_dir

CHUNK = 1 << 20
TREE_FORMAT = "reprorl.tree/1"
STALE_TMP_S = 3600.0
_TREE_HEAD = b'{"entries":['  # canonical JSON sorts keys, so every manifest starts so


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            yield chunk


def _digest_of(address: str) -> str:
    if not is_full_hash(address):
        raise UserInputError(f"{address!r} is not a full content hash (sha256:<64 hex>)")
    return address[len(HASH_PREFIX) :]


def file_hash(path: Path) -> str:
    """`sha256:<hex>` of a file's bytes, read in chunks: its address in a store."""
    digest = hashlib.sha256()
    for chunk in _chunks(Path(path)):
        digest.update(chunk)
    return HASH_PREFIX + digest.hexdigest()


def tree_hash(directory: Path, *, exclude: frozenset[str] = frozenset()) -> str:
    """The address `ContentStore.put_tree(directory)` would return, computed without storing.

    `exclude` names top-level files left out (a cache's own bookkeeping file).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise UserInputError(f"{str(directory)!r} is not a directory")
    entries: list[dict[str, object]] = []
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if rel in exclude or path.is_dir():
            continue
        if path.is_symlink() or not path.is_file():
            raise UserInputError(f"{rel!r} in {str(directory)!r} is not a regular file")
        entries.append(
            {
                "path": rel,
                "hash": file_hash(path),
                "size": path.stat().st_size,
                "exec": bool(path.stat().st_mode & stat.S_IXUSR),
            }
        )
    manifest = {"format": TREE_FORMAT, "entries": entries}
    return HASH_PREFIX + hashlib.sha256(canonical_json(manifest).encode("utf-8")).hexdigest()


class ContentStore:
    """Blobs and trees under `root/objects`, verified on every read."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.objects = self.root / "objects"
        self.tmp = self.root / "tmp"

    # -- paths ---------------------------------------------------------------------------------

    def _path(self, address: str) -> Path:
        digest = _digest_of(address)
        return self.objects / digest[:2] / digest[2:]

    def has(self, address: str) -> bool:
        return self._path(address).is_file()

    def addresses(self) -> Iterator[str]:
        if not self.objects.is_dir():
            return
        for shard in sorted(self.objects.iterdir()):
            for obj in sorted(shard.iterdir()):
                yield HASH_PREFIX + shard.name + obj.name

    # -- writing -------------------------------------------------------------------------------

    def _put_stream(self, chunks: Iterable[bytes]) -> tuple[str, int]:
        """Hash while writing to a temp file; move it into place under its hash at the end."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        hasher = hashlib.sha256()
        size = 0
        staging = self.tmp / f"stage-{os.getpid()}-{time.monotonic_ns()}"
        with atomic_writer(staging, tmp_dir=self.tmp, mode=0o444) as handle:
            for chunk in chunks:
                hasher.update(chunk)
                handle.write(chunk)
                size += len(chunk)
        address = HASH_PREFIX + hasher.hexdigest()
        final = self._path(address)
        try:
            if final.is_file():
                staging.unlink()  # identical content is already stored
            else:
                final.parent.mkdir(parents=True, exist_ok=True)
                staging.replace(final)
                fsync_dir(final.parent)
        except OSError as exc:
            staging.unlink(missing_ok=True)
            raise StoreError(f"could not store object {address}: {exc}") from exc
        return address, size

    def put_bytes(self, data: bytes) -> str:
        return self._put_stream([data])[0]

    def put_file(self, path: Path) -> str:
        return self._put_stream(_chunks(Path(path)))[0]

    def put_tree(self, directory: Path) -> str:
        """Store every regular file under `directory`; return the manifest's address."""
        directory = Path(directory)
        entries: list[dict[str, Any]] = []
        for path in sorted(directory.rglob("*")):
            rel = path.relative_to(directory).as_posix()
            if path.is_symlink():
                raise UserInputError(f"{rel!r} is a symbolic link; store the file it points to")
            if path.is_dir():
                continue
            if not path.is_file():
                raise UserInputError(f"{rel!r} is not a regular file")
            executable = bool(path.stat().st_mode & stat.S_IXUSR)
            address, size = self._put_stream(_chunks(path))
            entries.append({"path": rel, "hash": address, "size": size, "exec": executable})
        manifest = {"format": TREE_FORMAT, "entries": entries}
        return self.put_bytes(canonical_json(manifest).encode("utf-8"))

    # -- reading -------------------------------------------------------------------------------

    def _open(self, address: str, label: str) -> BinaryIO:
        try:
            return self._path(address).open("rb")
        except FileNotFoundError:
            raise ArtifactNotFoundError(f"{label}: object {address} is not in the store") from None

    def _verified_chunks(self, address: str, label: str) -> Iterator[bytes]:
        hasher = hashlib.sha256()
        with self._open(address, label) as handle:
            while chunk := handle.read(CHUNK):
                hasher.update(chunk)
                yield chunk
        self._check(address, HASH_PREFIX + hasher.hexdigest(), label)

    @staticmethod
    def _check(address: str, actual: str, label: str) -> None:
        if actual != address:
            raise IntegrityError(
                f"{label}: stored bytes are corrupt (expected {address[:19]}…, read {actual[:19]}…)",
                artifact=label,
                expected=address,
                actual=actual,
            )

    def get_bytes(self, address: str, *, label: str | None = None) -> bytes:
        """The blob's bytes, after checking they still hash to `address`."""
        name = label or address
        with self._open(address, name) as handle:
            data = handle.read()
        self._check(address, HASH_PREFIX + hashlib.sha256(data).hexdigest(), name)
        return data

    def verify(self, address: str, *, label: str | None = None) -> None:
        for _ in self._verified_chunks(address, label or address):
            pass

    def path_of(self, address: str, *, label: str | None = None, verify: bool = True) -> Path:
        """Read-only path of a verified blob, for libraries that want a filename (e.g. a GGUF)."""
        if verify:
            self.verify(address, label=label)
        return self._path(address)

    def is_tree(self, address: str) -> bool:
        """True when the object is a directory manifest (decided from its first bytes)."""
        with self._open(address, address) as handle:
            return handle.read(len(_TREE_HEAD)) == _TREE_HEAD

    def read_tree(self, address: str, *, label: str | None = None) -> dict[str, Any]:
        manifest: dict[str, Any] = json.loads(self.get_bytes(address, label=label))
        if not isinstance(manifest, dict) or manifest.get("format") != TREE_FORMAT:
            raise StoreError(f"{label or address}: object is not a directory manifest")
        return manifest

    def export_tree(self, address: str, destination: Path, *, label: str | None = None) -> Path:
        """Materialise a stored directory at `destination`, verifying every file."""
        name = label or address
        manifest = self.read_tree(address, label=name)
        destination = Path(destination)
        staging = destination.with_name(f".tmp-{destination.name}-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            for entry in manifest["entries"]:
                rel = Path(entry["path"])
                if rel.is_absolute() or ".." in rel.parts:
                    raise IntegrityError(
                        f"{name}: manifest path {entry['path']!r} escapes the directory",
                        artifact=name,
                        expected=address,
                        actual=address,
                    )
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("wb") as handle:
                    for chunk in self._verified_chunks(entry["hash"], f"{name}/{rel.as_posix()}"):
                        handle.write(chunk)
                if entry.get("exec"):
                    target.chmod(0o755)
            staging.replace(destination)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return destination

    # -- housekeeping --------------------------------------------------------------------------

    def sweep_tmp(self, older_than_s: float = STALE_TMP_S) -> int:
        """Delete temp files left by killed writers; returns how many were removed."""
        if not self.tmp.is_dir():
            return 0
        cutoff = time.time() - older_than_s
        removed = 0
        for path in self.tmp.iterdir():
            if path.stat().st_mtime < cutoff:
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def fsck(self) -> list[str]:
        """Addresses of every object whose bytes no longer match; empty means all is well."""
        bad: list[str] = []
        for address in self.addresses():
            try:
                self.verify(address)
            except IntegrityError:
                bad.append(address)
        return bad
