"""Artifact references: the only way a run spec may point at a model, task set, env or suite.

A reference is `name@vN` (a registry version), `name@sha256:<hex>` (pinned), `name@<hex prefix>`
or a bare `sha256:<hex>`. Labels that can move under a run (`latest`, `main`, ...) are refused,
because a run that said "latest" cannot say what it used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from reprorl.errors import UserInputError
from reprorl.hashing import HASH_PREFIX, is_full_hash

FLOATING_LABELS = frozenset(
    {"latest", "production", "prod", "main", "master", "head", "current", "stable", "newest", "dev"}
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/]{0,127}$")
_SEQ_VERSION = re.compile(r"^v([1-9][0-9]*)$")
_HEX_PREFIX = re.compile(r"^(?:sha256:)?([0-9a-f]{8,64})$")


class RefError(UserInputError):
    """A reference that is not of an accepted form; the message says which form to use."""


@dataclass(frozen=True)
class ParsedRef:
    """A reference split into its parts; exactly one of `seq`, `digest` is set."""

    name: str | None
    seq: int | None = None
    digest: str | None = None  # full or prefix hex, without "sha256:"

    @property
    def is_pinned(self) -> bool:
        """True when the reference names one exact content hash."""
        return self.digest is not None and len(self.digest) == 64

    def __str__(self) -> str:
        version = f"v{self.seq}" if self.seq is not None else f"{HASH_PREFIX}{self.digest}"
        return version if self.name is None else f"{self.name}@{version}"


def check_name(name: str) -> str:
    """An artifact name as the registry accepts it, or `RefError` saying what a name may hold."""
    if not _NAME.fullmatch(name) or ".." in name.split("/"):
        raise RefError(
            f"{name[:140]!r} is not a valid artifact name (letters, digits, '.', '_', '-', '/'; "
            "at most 128 characters, no '..' part)"
        )
    return name


def parse_ref(text: str) -> ParsedRef:
    """Parse a reference or raise `RefError` saying what is wrong and how to write it."""
    text = text.strip()
    if is_full_hash(text):
        return ParsedRef(name=None, digest=text[len(HASH_PREFIX) :])
    if text.startswith(HASH_PREFIX) and "@" not in text:
        digest = text[len(HASH_PREFIX) :]
        bad = sorted({c for c in digest if c not in "0123456789abcdef"})
        what = f"holds {''.join(bad)[:20]!r}, not hex" if bad else f"has {len(digest)} hex digits"
        raise RefError(
            f"{text[:80]!r} is not a content hash: after 'sha256:' come exactly 64 lowercase hex digits "
            f"(it {what}); or name the artifact, 'NAME@vN' (reprorl artifacts list shows both)"
        )
    if "@" not in text:
        raise RefError(
            f"{text!r} has no version; write '{text or 'NAME'}@vN' or '{text or 'NAME'}@sha256:<hash>'"
            " (reprorl spec resolve --pin-newest pins names to their newest hash)"
        )
    name, _, version = text.rpartition("@")
    if not _NAME.fullmatch(name):
        raise RefError(f"{name!r} is not a valid artifact name (letters, digits, '.', '_', '-', '/')")
    if not version:
        raise RefError(f"{text!r} has an empty version; write '{name}@vN' or '{name}@sha256:<hash>'")
    if version.lower() in FLOATING_LABELS:
        raise RefError(
            f"'{text}' uses the floating label '{version}', which can move under a run; "
            f"pin a version: '{name}@vN' or '{name}@sha256:<hash>'"
        )
    if m := _SEQ_VERSION.match(version):
        return ParsedRef(name=name, seq=int(m.group(1)))
    if m := _HEX_PREFIX.match(version):
        return ParsedRef(name=name, digest=m.group(1))
    raise RefError(
        f"'{text}' has version '{version}', which is neither 'vN' nor a sha256 hash (>= 8 hex digits)"
    )


class ArtifactRef(str):
    """A spec value that references an artifact, validated and kept in canonical spelling."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[Any], handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls._validate,
            core_schema.str_schema(),
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )

    @classmethod
    def _validate(cls, text: str) -> ArtifactRef:
        return cls(str(parse_ref(text)))

    @property
    def parsed(self) -> ParsedRef:
        return parse_ref(self)
