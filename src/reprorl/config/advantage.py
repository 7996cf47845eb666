"""The `learning.advantage` name: a group advantage estimator, chosen from those registered.

Every estimator registers itself by name (`reprorl.algos.register_advantage` on its class), built in
or from an installed package (entry-point group `reprorl.advantages`), so the spec knows one only by
name and a new estimator is one file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Protocol

from pydantic import AfterValidator

from reprorl.registry import Registry


class AdvantageEstimator(Protocol):
    """Rewards of one group ([G]) to one advantage per member ([G])."""

    name: str

    def __call__(self, rewards: Any) -> Any: ...


ADVANTAGES: Registry[Callable[[], AdvantageEstimator]] = Registry(
    "advantage estimator", "reprorl.advantages", builtins=("reprorl.algos",)
)


def _registered(name: str) -> str:
    if name not in ADVANTAGES:
        raise ValueError(
            f"no advantage estimator {name!r}; advantage estimators: {', '.join(ADVANTAGES.names())}"
        )
    return name


AdvantageName = Annotated[str, AfterValidator(_registered)]
