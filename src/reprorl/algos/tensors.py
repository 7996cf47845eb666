"""torch as the loss files use it, loaded on first use: a spec names and validates a loss (its config
lives in the loss's file) without the second it takes to import torch."""

from __future__ import annotations

import importlib
from typing import Any


class _Torch:
    """Stands for the `torch` module; the first attribute asked for imports it, and every attribute
    it had then is copied here, so later lookups cost what a module's own would."""

    def __getattr__(self, name: str) -> Any:
        module = importlib.import_module("torch")
        self.__dict__.update(vars(module))
        return getattr(module, name)


torch = _Torch()
