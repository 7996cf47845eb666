"""A tool module that imports from reprorl's public API, as the docs show: the zygote imports only
the submodule that defines each name it reads, never the package's own __init__."""

from __future__ import annotations

import sys
from typing import Any

from reprorl import Split


def train_split(ctx: Any) -> str:
    return Split.TRAIN.value


def loaded(ctx: Any, name: str) -> str:
    return str(name in sys.modules)
