"""How a loss becomes selectable by name: `@register_loss(Config)` on the function that builds it
(and an advantage estimator: `@register_advantage` on its class).

A loss file declares its config (a `LossConfig` whose `kind` default is the loss's name, with the
loss's own fields) and a builder taking that config and what every policy-gradient loss shares
(`LossShared`: the importance correction of sampler tokens and the KL penalty). Decorating the
builder registers both, so `learning.loss = { kind = "<name>", ... }` selects it; an installed
package offers its loss through the entry-point group `reprorl.losses` pointing at that builder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from reprorl.algos.base import Loss
from reprorl.algos.importance import Correction, TruncatedIS
from reprorl.config.advantage import ADVANTAGES, AdvantageEstimator
from reprorl.config.kinds import declared_kind
from reprorl.config.loss import LOSSES, LossConfig, LossEntry

C = TypeVar("C", bound=LossConfig)
A = TypeVar("A", bound=Callable[[], AdvantageEstimator])


@dataclass(frozen=True)
class LossShared:
    """What every policy-gradient loss is built with besides its own config."""

    # Of the sampler's tokens toward π_prox (`learning.correction`).
    correction: Correction = field(default_factory=lambda: TruncatedIS(2.0))
    kl_coef: float = 0.0  # β of the KL penalty to the reference (`learning.kl.coef`)
    kl_estimator: str = "k2"  # its estimator (`learning.kl.estimator`)


Builder = Callable[[C, LossShared], Loss]


def register_loss(config: type[C]) -> Callable[[Builder[C]], Builder[C]]:
    """Register the decorated builder as the loss `config`'s `kind` default names."""
    kind = declared_kind(config, "loss", "gspo")

    def decorate(build: Builder[C]) -> Builder[C]:
        entry = LOSSES.add(kind, LossEntry(kind, config, build), module=build.__module__)
        build.__reprorl_loss__ = entry  # type: ignore[attr-defined]  # what an entry point finds
        return build

    return decorate


def register_advantage(estimator: A) -> A:
    """Register the decorated class as the advantage estimator its `name` says
    (`learning.advantage = "<name>"`); an installed package offers one through the entry-point group
    `reprorl.advantages` pointing at its class."""
    name = getattr(estimator, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{estimator!r} needs a class attribute `name`, the advantage's name in a spec")
    ADVANTAGES.add(name, estimator, module=estimator.__module__)
    return estimator


def build_loss(config: LossConfig, shared: LossShared) -> Loss:
    """The loss `config` selects, built with its own fields and `shared`."""
    loss: Loss = LOSSES[config.kind].build(config, shared)
    if loss.name != config.kind:
        raise TypeError(f"the loss registered as {config.kind!r} built one named {loss.name!r}")
    if getattr(loss, "mean", None) not in ("token", "sequence"):
        raise TypeError(f"loss {config.kind!r} must say how it averages: mean = 'token' or 'sequence'")
    return loss
