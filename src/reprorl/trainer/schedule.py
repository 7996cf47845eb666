"""Learning-rate schedules: linear warmup to a peak, then constant, linear or cosine decay to zero."""

from __future__ import annotations

import math
from typing import Literal

Schedule = Literal["constant", "linear", "cosine"]


def scheduled_lr(peak: float, step: int, steps: int, schedule: Schedule, warmup_steps: int = 0) -> float:
    """The rate at `step` (0-based) of `steps`: `warmup_steps` rising linearly to `peak`, then the
    schedule from `peak` at the first step after warmup toward zero after the last one."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    span = max(steps - warmup_steps, 1)
    progress = (step - warmup_steps) / span
    if schedule == "linear":
        return peak * (1.0 - progress)
    if schedule == "cosine":
        return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak
