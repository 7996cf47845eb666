"""The store home: one root folder holding blobs, the registry database and run records.

`Store` ties the content-addressed blobs to the registry of names, so a caller can add a file or
folder under a name, resolve any reference to its exact hash, and read it back verified.
The root is `REPRORL_HOME` or `~/.reprorl`; the database is `REPRORL_DB_URL` or SQLite inside it.
Nothing is created on disk until something is written.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from reprorl.errors import ArtifactNotFoundError, UserInputError
from reprorl.refs import ParsedRef, parse_ref
from reprorl.store.atomic import write_atomic
from reprorl.store.blobs import ContentStore
from reprorl.store.registry import ArtifactVersion, Registry
from reprorl.types import TaskSet


def default_root() -> Path:
    env = os.environ.get("REPRORL_HOME")
    return Path(env).expanduser() if env else Path.home() / ".reprorl"


@dataclass(frozen=True)
class Resolved:
    """A reference after lookup: the registered version (if named) and its exact hash."""

    ref: ParsedRef
    hash: str
    version: ArtifactVersion | None

    @property
    def pinned(self) -> str:
        name = self.ref.name or (self.version.name if self.version else None)
        return f"{name}@{self.hash}" if name else self.hash


class Store:
    """Blobs + registry + runs under one root."""

    def __init__(self, root: Path | None = None, db_url: str | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self._db_url = db_url or os.environ.get("REPRORL_DB_URL")

    @property
    def db_url(self) -> str:
        return self._db_url or f"sqlite:///{self.root / 'registry.db'}"

    @cached_property
    def blobs(self) -> ContentStore:
        return ContentStore(self.root)

    @cached_property
    def registry(self) -> Registry:
        if self._db_url is None:
            self.root.mkdir(parents=True, exist_ok=True)
        return Registry(self.db_url)

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    def close(self) -> None:
        if "registry" in self.__dict__:
            self.registry.close()

    # -- artifacts -----------------------------------------------------------------------------

    def add(
        self, name: str, path: Path, *, kind: str | None = None, meta: dict[str, Any] | None = None
    ) -> ArtifactVersion:
        """Store a file or folder and register it as the newest version of `name`."""
        parse_ref(f"{name}@v1")  # validates the name with the same rules a spec uses
        path = Path(path)
        if kind == "taskset" and path.is_file():
            # Task sets are stored canonically, so formatting changes do not make a new version.
            tasks = TaskSet.from_jsonl(name, path.read_bytes(), source=str(path))
            return self.add_bytes(
                name,
                tasks.to_jsonl(),
                kind="taskset",
                meta={"source_name": path.name, "tasks": len(tasks.tasks), **(meta or {})},
            )
        if path.is_dir():
            address = self.blobs.put_tree(path)
            manifest = self.blobs.read_tree(address)
            size = sum(int(e["size"]) for e in manifest["entries"])
            kind = kind or "tree"
        elif path.is_file():
            address = self.blobs.put_file(path)
            size = path.stat().st_size
            kind = kind or "file"
        else:
            raise UserInputError(f"{str(path)!r} does not exist", field="PATH")
        info = {"source_name": path.name, **(meta or {})}
        return self.registry.register(name, address, kind=kind, size=size, meta=info)

    def add_bytes(
        self, name: str, data: bytes, *, kind: str, meta: dict[str, Any] | None = None
    ) -> ArtifactVersion:
        parse_ref(f"{name}@v1")
        address = self.blobs.put_bytes(data)
        return self.registry.register(name, address, kind=kind, size=len(data), meta=meta)

    def resolve(self, ref: str) -> Resolved:
        """Look up any accepted reference form; a full bare hash need not be registered."""
        parsed = parse_ref(ref)
        if parsed.name is None and parsed.is_pinned:
            address = f"sha256:{parsed.digest}"
            # A full hash pins content by itself; the registry only adds a name if it knows one.
            found = None
            if self.has_registry():
                with contextlib.suppress(ArtifactNotFoundError):
                    found = self.registry.lookup(None, digest=parsed.digest)
            return Resolved(parsed, address, found)
        self._require_registry(ref)
        version = self.registry.lookup(parsed.name, seq=parsed.seq, digest=parsed.digest)
        return Resolved(parsed, version.hash, version)

    def pin(self, ref: str) -> str:
        """The `name@sha256:<hex>` a run spec stores for `ref`."""
        return self.resolve(ref).pinned

    def pin_newest(self, ref: str) -> str:
        """Like `pin`, but a bare name (no version) resolves to its newest registered hash."""
        if "@" not in ref and not ref.startswith("sha256:"):
            self._require_registry(ref)
            return self.registry.newest(ref).ref
        return self.pin(ref)

    def read(self, ref: str) -> bytes:
        resolved = self.resolve(ref)
        return self.blobs.get_bytes(resolved.hash, label=_label(ref, resolved))

    def taskset(self, ref: str) -> TaskSet:
        """A stored task set, read and checked against its hash, named as the registry names it."""
        resolved = self.resolve(ref)
        name = resolved.version.name if resolved.version else ref
        return TaskSet.from_jsonl(name, self.read(ref), source=ref)

    def export(self, ref: str, destination: Path) -> Path:
        """Write the artifact (file or folder) to `destination`, verified."""
        resolved = self.resolve(ref)
        label = _label(ref, resolved)
        if self.blobs.is_tree(resolved.hash):
            return self.blobs.export_tree(resolved.hash, destination, label=label)
        write_atomic(Path(destination), self.blobs.get_bytes(resolved.hash, label=label))
        return Path(destination)

    def has_registry(self) -> bool:
        """True when a registry exists; looking things up never creates one."""
        return self._db_url is not None or (self.root / "registry.db").exists()

    def _require_registry(self, ref: str) -> None:
        if not self.has_registry():
            raise ArtifactNotFoundError(
                f"{ref} cannot be resolved: no registry under {self.root} "
                "(add artifacts with 'reprorl artifacts add' or set REPRORL_HOME)"
            )


def _label(ref: str, resolved: Resolved) -> str:
    return resolved.version.label if resolved.version else ref
