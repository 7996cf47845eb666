"""Rewards an external env reported itself: an OpenEnv server's step rewards, as reprorl took them from it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from reprorl.rewards.base import FinalState, Verifier
from reprorl.rewards.registered import register_verifier
from reprorl.types import Task


@register_verifier("env-reported")
@dataclass(frozen=True)
class EnvReported(Verifier):
    """The outcome is the env's own: the sum of its step rewards (`return`) or the last one, clipped
    to [0, 1]; `env/steps` and `env/done` say how the episode went there.

    The figures come from the server through reprorl (`FinalState.reported`), never from a file the
    agent could write; an episode with no report, or a non-finite one, fails to score (the env's
    failure, excluded and counted), and never scores 0."""

    outcome: Literal["return", "last"] = "return"

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        reported = state.reported
        if reported is None:
            raise ValueError("the env reported nothing of this episode (env-reported needs an external env)")
        value = reported.get(self.outcome)
        if value is None or not math.isfinite(value):
            raise ValueError(f"the env reported {self.outcome}={value!r}, not a finite number")
        return {
            self.name: min(1.0, max(0.0, value)),
            "env/done": 1.0 if reported.get("done") else 0.0,
        }
