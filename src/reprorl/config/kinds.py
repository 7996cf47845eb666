"""Spec tables chosen by `kind`: the registered part's own config validates the rest of the table.

The loss (`learning.loss`) and the judge (`data.judge`) are such tables. Their registries hold each
part with its config model, so a part an installed package registers is configured exactly like a
built-in one, with no field of it named in the spec's code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidatorFunctionWrapHandler

from reprorl.registry import Registry

E = TypeVar("E")
M = TypeVar("M", bound=BaseModel)


def kind_validator(
    registry: Registry[E],
    config_of: Callable[[E], type[M]],
    *,
    base: type[M],
    default: str | None,
    example: str,
) -> Callable[[Any, ValidatorFunctionWrapHandler], M]:
    """A wrap validator for a table whose `kind` (or `default`, when it gives none) picks the config.

    With a `default`, a bare name stands for `{ kind = name }` (every other field then takes its
    default); without one a table must name its kind. `example` shows a valid table in messages.
    """

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> M:
        # Validated by the config its `kind` registered, not by `handler` (the base's).
        if isinstance(value, base):
            kind = getattr(value, "kind", None)
            entry = registry.get(kind) if isinstance(kind, str) else None
            if entry is None or not isinstance(value, config_of(entry)):
                raise ValueError(
                    f"no {registry.what} {kind!r} is registered with config {type(value).__name__}"
                )
            return value
        if isinstance(value, str) and default is not None:
            value = {"kind": value}
        if not isinstance(value, dict):
            shorthand = f"a {registry.what} name or " if default is not None else ""
            raise ValueError(f"must be {shorthand}a table with `kind`, e.g. {example}")
        kind = value.get("kind", default)
        if not isinstance(kind, str) or kind not in registry:
            known = ", ".join(registry.names())
            raise ValueError(f"no {registry.what} {kind!r}; {registry.plural}: {known}")
        # JSON mode, strictly, as every spec table: "3" is not a number here.
        config: M = config_of(registry[kind]).model_validate_json(
            json.dumps({**value, "kind": kind}, default=str), strict=True
        )
        return config

    return validate


def declared_kind(config: type[BaseModel], what: str, example: str) -> str:
    """The name a part's config declares as its `kind` default, which is the name it registers under."""
    kind = config.model_fields["kind"].default
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"{config.__name__}.kind needs a default: the {what}'s name, e.g. {example!r}")
    return kind
