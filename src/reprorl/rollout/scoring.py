"""What counts: a batch's rollouts split into those that train and score and those left out, by class.

`reprorl.types.exclusion` is the one rule; this module applies it to batches and names the figures
every step and eval point reports about it: `unscored` (rollouts left out), `unscored_share` (of all
final rollouts) and `excluded/<class>` for each class, zeros included so every line has every key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from reprorl.types import ScoreFailure, Termination, Trajectory, exclusion

EXCLUDED = "excluded/"
# Every class a final rollout can be left out for (a retried attempt is never a final rollout).
CLASSES = (
    Termination.INFRA_ERROR.value,
    Termination.SANDBOX_ERROR.value,
    *(f.value for f in ScoreFailure if f is not ScoreFailure.AGENT_STATE),
)


def counted(trajectories: Iterable[Trajectory]) -> list[Trajectory]:
    """The rollouts that enter the update and the figures."""
    return [t for t in trajectories if exclusion(t) is None]


def exclusion_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """How many of `trajectories` were left out, their share, and how many for each class."""
    classes = Counter(c for t in trajectories if (c := exclusion(t)) is not None)
    left_out = sum(classes.values())
    return {
        "unscored": float(left_out),
        "unscored_share": left_out / len(trajectories) if trajectories else 0.0,
        **{
            f"{EXCLUDED}{c}": float(classes.get(c, 0))
            for c in (*CLASSES, *sorted(set(classes) - set(CLASSES)))
        },
    }
