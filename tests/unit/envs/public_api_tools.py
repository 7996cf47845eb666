"""A tool module that imports from reprorl's public API, as the docs show: the zygote runs the
package's own __init__ for it, where a module that reads no name from `reprorl` never pays for it."""

from __future__ import annotations

import sys
from typing import Any

from reprorl import Split


def train_split(ctx: Any) -> str:
    return Split.TRAIN.value


def loaded(ctx: Any, name: str) -> str:
    return str(name in sys.modules)
