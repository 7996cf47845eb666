"""The `learning.loss` table: a loss chosen by `kind`, configured by the fields its own file declares.

Every loss registers itself with its config model (`reprorl.algos.register_loss`), built-in or from an
installed package (entry-point group `reprorl.losses`), so the spec knows a loss only by name: the
table's `kind` picks the registered config, which validates the rest of the table as strictly as
any other section. `loss = "gspo"` is short for `loss = { kind = "gspo" }`; without a table the loss
is PPO clip with its defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, SerializeAsAny, WrapValidator

from reprorl.config.base import SpecModel
from reprorl.config.kinds import kind_validator
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


_validate_loss = kind_validator(
    LOSSES, lambda entry: entry.config, base=LossConfig, default=DEFAULT_KIND, example="{ kind = 'ppo_clip' }"
)


LossTable = Annotated[SerializeAsAny[LossConfig], WrapValidator(_validate_loss)]


def default_loss() -> LossConfig:
    """The loss of a spec that names none: PPO clip with its defaults."""
    config: LossConfig = LOSSES[DEFAULT_KIND].config(kind=DEFAULT_KIND)
    return config
