"""Verifiers by name: `@register_verifier("numeric")` on a `Verifier` class, or an installed package's.

The decorator records the name on the class and, on every instance, the arguments it was built
with (a verifier's settings are part of its version, dataclass or not); an installed package offers
its own through the entry-point group `reprorl.verifiers`, its value the decorated class. A reward
audit (`reprorl rewards audit --verifier FAMILY=NAME`) takes a verifier by this name.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from reprorl.registry import Registry
from reprorl.rewards.base import Verifier

V = TypeVar("V", bound=type[Verifier])
ARGS = "_registry_args"


def _accept(name: str, loaded: object) -> type[Verifier] | None:
    return loaded if isinstance(loaded, type) and issubclass(loaded, Verifier) else None


VERIFIERS: Registry[type[Verifier]] = Registry(
    "verifier", "reprorl.verifiers", builtins=("reprorl.rewards.verifiers",), accept=_accept
)


def register_verifier(name: str) -> Callable[[V], V]:
    """Register the decorated verifier class as `name`, capturing each instance's arguments."""

    def decorate(cls: V) -> V:
        original = cls.__init__

        @functools.wraps(original)
        def init(self: Verifier, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            bound = inspect.signature(original).bind(self, *args, **kwargs)
            bound.apply_defaults()
            captured = {k: v for k, v in list(bound.arguments.items())[1:]}
            object.__setattr__(self, ARGS, captured)  # frozen dataclasses too

        cls.__init__ = init  # type: ignore[method-assign,assignment]
        cls.registry_name = name
        VERIFIERS.add(name, cls, module=cls.__module__)
        return cls

    return decorate


def registry_args(verifier: Verifier) -> dict[str, Any]:
    """The arguments a registered verifier was built with (empty for one that is not registered)."""
    return dict(getattr(verifier, ARGS, {}))
