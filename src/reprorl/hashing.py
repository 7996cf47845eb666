"""Canonical JSON and sha256: the one way reprorl turns a value into a stable content hash."""

from __future__ import annotations

import hashlib
import json
from typing import Any

HASH_PREFIX = "sha256:"


def canonical_json(value: Any, *, allow_nan: bool = False) -> str:
    """Serialise `value` so equal values give identical text: sorted keys, no spaces, UTF-8.

    Hashed documents refuse NaN and infinity (JSON has no such numbers); measurement logs, where
    a NaN loss is a fact worth keeping, pass `allow_nan=True`.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=allow_nan)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_hash(value: Any) -> str:
    """`sha256:<hex>` of the canonical JSON of `value`."""
    return HASH_PREFIX + sha256_hex(canonical_json(value).encode("utf-8"))


def is_full_hash(text: str) -> bool:
    """True for `sha256:` followed by 64 lowercase hex digits."""
    if not text.startswith(HASH_PREFIX):
        return False
    digest = text[len(HASH_PREFIX) :]
    return len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
