"""Canonical JSON and sha256: the one way reprorl turns a value into a stable content hash."""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import types
from pathlib import Path
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


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from any JSON-able parts: equal parts give equal seeds, any change a new one.

    Used to give every sampler, shuffler and episode its own seed from the run's root seed, e.g.
    `derive_seed(run_seed, "rollout", task_id, member)`.
    """
    digest = hashlib.sha256(canonical_json(list(parts)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@functools.cache
def module_fingerprint(module_name: str) -> str:
    """sha256 of a module's source and of every module of its own package that it uses, transitively.

    Used as the code part of tool, env and verifier versions: editing a helper module next to a
    tool (a SQL guard, a data builder) changes the tool's version, while edits to the framework
    around it do not. Cached: modules do not change under a running process.
    """
    package = module_name.rpartition(".")[0]
    seen: set[str] = set()
    pending = [module_name]
    digest = hashlib.sha256()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        module = sys.modules.get(name)
        source = getattr(module, "__file__", None)
        if module is None or source is None:
            continue
        digest.update(name.encode() + b"\0" + Path(source).read_bytes() + b"\0")
        for value in vars(module).values():
            used = (
                value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
            )
            if isinstance(used, str) and used != name and _in_package(used, package):
                pending.append(used)
    return digest.hexdigest()


def _in_package(name: str, package: str) -> bool:
    return name.rpartition(".")[0] == package if package else False


def code_fingerprint(*objects: Any) -> str:
    """Combined `module_fingerprint` of the modules defining `objects` (functions or classes)."""
    modules = sorted({getattr(o, "__module__", "") for o in objects} - {"", "builtins", "abc"})
    return sha256_hex("".join(module_fingerprint(m) for m in modules).encode())
