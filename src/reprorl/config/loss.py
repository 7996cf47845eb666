"""The `learning.loss` table: a loss chosen by `kind`, configured by the fields its own file declares.

Every loss registers itself with its config model (`reprorl.algos.register_loss`), built-in or from an
installed package (entry-point group `reprorl.losses`), so the spec knows a loss only by name: the
table's `kind` picks the registered config, which validates the rest of the table as strictly as
any other section. `loss = "gspo"` is short for `loss = { kind = "gspo" }`; without a table the loss
is PPO clip with its defaults.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, SerializeAsAny, ValidatorFunctionWrapHandler, WrapValidator

from reprorl.config.base import SpecModel
from reprorl.registry import Registry

DEFAULT_KIND = "ppo_clip"

Mean = Literal["token", "sequence"]
"""How a loss averages a batch: every learned token weighs the same, or every sequence does."""


class LossConfig(SpecModel):
    """Base of every loss's config: `kind` names the registered loss; the subclass adds its fields."""

    kind: str = Field(description="The registered loss, e.g. 'ppo_clip', 'gspo', 'cispo'.")

    @classmethod
    def variants(cls) -> list[type[SpecModel]]:
        """The built-in losses' configs, for the spec reference."""
        return [LOSSES[name].config for name in LOSSES.builtin_names()]


@dataclass(frozen=True)
class LossEntry:
    """A registered loss: its config model and how to build it."""

    kind: str
    config: type[LossConfig]
    build: Callable[..., Any]  # (config, shared) -> the loss object the trainer calls

    @property
    def identity(self) -> tuple[str, str]:
        return self.build.__module__, self.build.__qualname__


def _accept(name: str, loaded: object) -> LossEntry | None:
    entry = getattr(loaded, "__reprorl_loss__", None)
    return entry if isinstance(entry, LossEntry) else None


LOSSES: Registry[LossEntry] = Registry("loss", "reprorl.losses", builtins=("reprorl.algos",), accept=_accept)


def _validate_loss(value: Any, handler: ValidatorFunctionWrapHandler) -> LossConfig:
    # The table is validated by the config its `kind` registered, not by `handler` (the base's).
    if isinstance(value, LossConfig):
        entry = LOSSES.get(value.kind)
        if entry is None or not isinstance(value, entry.config):
            raise ValueError(f"no loss {value.kind!r} is registered with config {type(value).__name__}")
        return value
    if isinstance(value, str):
        value = {"kind": value}
    if not isinstance(value, dict):
        raise ValueError("must be a loss name or a table with `kind`, e.g. { kind = 'ppo_clip' }")
    kind = value.get("kind", DEFAULT_KIND)
    if not isinstance(kind, str) or kind not in LOSSES:
        raise ValueError(f"no loss {kind!r}; losses: {', '.join(LOSSES.names())}")
    config: LossConfig = LOSSES[kind].config.model_validate_json(
        json.dumps({**value, "kind": kind}), strict=True
    )
    return config


LossTable = Annotated[SerializeAsAny[LossConfig], WrapValidator(_validate_loss)]


def default_loss() -> LossConfig:
    """The loss of a spec that names none: PPO clip with its defaults."""
    config: LossConfig = LOSSES[DEFAULT_KIND].config(kind=DEFAULT_KIND)
    return config
