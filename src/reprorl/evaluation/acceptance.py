"""Acceptance thresholds: the minimum each named eval figure must reach, declared before training.

`evaluation.thresholds` maps a figure's short name (`success`, `partial_credit`, ...) to its
minimum. Each eval point reports `accepted` (1 when every threshold holds on that suite, else 0)
and, per threshold, `accept/<name>` (1 or 0); a figure the suite does not report fails its check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def acceptance(thresholds: Mapping[str, float], figures: Mapping[str, float]) -> dict[str, float]:
    """The acceptance figures of one suite's point, from its figures keyed by short name."""
    if not thresholds:
        return {}
    checks = {}
    for name, minimum in sorted(thresholds.items()):
        value = figures.get(name, math.nan)
        checks[f"accept/{name}"] = 1.0 if value >= minimum else 0.0  # NaN compares False
    return {"accepted": float(all(v == 1.0 for v in checks.values())), **checks}
