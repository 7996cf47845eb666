"""Report series: per-step figures taken from rollout rows and metric lines, each with its 95% interval.

Train reward and success are recomputed from the stored rollouts (the agent's final attempts, as the
loop's `reward_mean` and `success` count them), because the metric lines keep only the means. Every
other figure is read from the metric lines by its key name, never derived from a guess.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reprorl.evaluation.stats import mean_ci, proportion_ci
from reprorl.hashing import derive_seed
from reprorl.types import ToolOutcome, outcome_success

Point = float | None
OUTCOMES = frozenset(o.value for o in ToolOutcome)
# Health panels: a title and how its keys are picked from a train metric line.
HEALTH_PANELS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    # (title, exact keys, key prefixes)
    ("policy entropy", ("train/entropy",), ()),
    ("KL to reference", (), ("train/kl",)),
    ("clip fractions", ("train/clip_frac_high", "train/clip_frac_low"), ()),
    ("sampler/trainer mismatch", (), ("train/mismatch",)),
    ("gradient norm", ("train/grad_norm",), ()),
    ("importance weights", ("train/is_weight_mean", "train/is_weight_min", "train/is_weight_max"), ()),
    ("zero-variance group share", ("zero_variance_share",), ()),
    ("response length (tokens)", ("response_tokens_mean",), ()),
    ("truncation rate", ("truncation_rate",), ()),
    ("staleness (updates behind)", ("staleness_mean", "staleness_max"), ()),
    ("sample queue and trainer", ("timing/queue_depth", "timing/trainer_busy"), ()),
    ("episode time in tools and env", ("timing/env_share",), ()),
    ("reward integrity", ("integrity/contradicted", "integrity/cross_disagree", "integrity/signature"), ()),
)


@dataclass(frozen=True)
class Band:
    """One line over steps, with its interval where it has one (None where undefined)."""

    name: str
    x: list[int]
    y: list[Point]
    low: list[Point] | None = None
    high: list[Point] | None = None

    @property
    def empty(self) -> bool:
        return all(v is None for v in self.y)


def finite(value: Any) -> Point:
    """A plottable number: None for a missing, non-numeric or non-finite value."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def final_train_rows(rows: Iterable[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    """Train rollouts by step, without infra-failed attempts that were run again (never the agent's)."""
    steps: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        if row.get("split") == "train" and not row.get("retried") and isinstance(row.get("step"), int):
            steps[int(row["step"])].append(row)
    return dict(sorted(steps.items()))


def reward_of(row: Mapping[str, Any]) -> float:
    """A rollout's reward as the loop counts it: a missing reward is 0."""
    value = finite(row.get("reward_total"))
    return 0.0 if value is None else value


def succeeded(row: Mapping[str, Any]) -> bool:
    total = finite(row.get("reward_total"))
    return total is not None and outcome_success(total, row.get("reward_components") or {})


def reward_band(steps: Mapping[int, Sequence[Mapping[str, Any]]], run_seed: int = 0) -> Band:
    """Mean train reward per step with a percentile-bootstrap 95% interval over its rollouts."""
    x: list[int] = []
    y: list[Point] = []
    low: list[Point] = []
    high: list[Point] = []
    for step, rows in steps.items():
        estimate = mean_ci([reward_of(r) for r in rows], seed=derive_seed(run_seed, "report-reward", step))
        x.append(step)
        y.append(finite(estimate.value))
        low.append(finite(estimate.low))
        high.append(finite(estimate.high))
    return Band("train reward", x, y, low, high)


def success_band(steps: Mapping[int, Sequence[Mapping[str, Any]]]) -> Band:
    """Train success rate per step (outcome success) with the Wilson 95% interval."""
    x: list[int] = []
    y: list[Point] = []
    low: list[Point] = []
    high: list[Point] = []
    for step, rows in steps.items():
        estimate = proportion_ci(sum(succeeded(r) for r in rows), len(rows))
        x.append(step)
        y.append(estimate.value)
        low.append(estimate.low)
        high.append(estimate.high)
    return Band("train success", x, y, low, high)


def metric_band(lines: Sequence[Mapping[str, Any]], key: str, name: str | None = None) -> Band:
    """One metric key over the steps of `lines` (a line without it leaves a gap)."""
    return Band(name or key, [int(m["step"]) for m in lines], [finite(m.get(key)) for m in lines])


def suite_name(line: Mapping[str, Any]) -> str | None:
    """The suite an eval line measured, as its keys name it (`eval/<suite>/success`)."""
    ref = line.get("suite")
    if isinstance(ref, str) and f"eval/{ref.split('@', 1)[0]}/success" in line:
        return ref.split("@", 1)[0]
    names = sorted(
        k[len("eval/") : -len("/success")]
        for k in line
        if k.startswith("eval/") and k.endswith("/success") and k.count("/") == 2
    )
    return names[0] if names else None


def eval_points(lines: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Eval lines by suite name, in step order."""
    suites: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for line in sorted(lines, key=lambda m: int(m["step"])):
        name = suite_name(line)
        if name is not None:
            suites[name].append(line)
    return dict(sorted(suites.items()))


def eval_band(suite: str, lines: Sequence[Mapping[str, Any]], figure: str = "success") -> Band:
    """An eval figure of one suite over its eval points, with the interval the loop logged."""
    key = f"eval/{suite}/{figure}"
    return Band(
        suite,
        [int(m["step"]) for m in lines],
        [finite(m.get(key)) for m in lines],
        [finite(m.get(f"{key}_low")) for m in lines],
        [finite(m.get(f"{key}_high")) for m in lines],
    )


def health_keys(lines: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
    """The health panels the metric lines can fill, each with the keys found for it."""
    present = sorted({k for m in lines for k, v in m.items() if finite(v) is not None})
    panels = []
    for title, exact, prefixes in HEALTH_PANELS:
        keys = [k for k in exact if k in present]
        keys += [k for k in present if k.startswith(prefixes) and k not in keys] if prefixes else []
        if keys:
            panels.append((title, keys))
    return panels


def tool_counts(line: Mapping[str, Any]) -> dict[tuple[str, str], float]:
    """(tool, outcome) → calls in one train line's `tools/<tool>/<outcome>` counts."""
    counts: dict[tuple[str, str], float] = {}
    for key, value in line.items():
        if not key.startswith("tools/"):
            continue
        tool, _, outcome = key[len("tools/") :].rpartition("/")
        number = finite(value)
        if tool and outcome in OUTCOMES and number is not None:
            counts[(tool, outcome)] = number
    return counts


@dataclass(frozen=True)
class ToolSeries:
    """Tool calls over steps: calls per tool, failure rate per tool, and rate per failure class."""

    steps: list[int]
    calls: dict[str, list[float]]
    failure_rate: dict[str, list[Point]]
    class_rate: dict[str, list[Point]]

    @property
    def empty(self) -> bool:
        return not any(v for values in self.calls.values() for v in values)


def tool_series(lines: Sequence[Mapping[str, Any]]) -> ToolSeries:
    per_step = [tool_counts(m) for m in lines]
    tools = sorted({tool for counts in per_step for tool, _ in counts})
    classes = sorted(
        {o for counts in per_step for (_, o), n in counts.items() if o != ToolOutcome.OK.value and n > 0}
    )
    calls = {t: [sum(n for (name, _), n in c.items() if name == t) for c in per_step] for t in tools}
    totals = [sum(c.values()) for c in per_step]
    class_rate = {
        o: [
            sum(n for (_, outcome), n in c.items() if outcome == o) / total if total else None
            for c, total in zip(per_step, totals, strict=True)
        ]
        for o in classes
    }
    # The loop's own per-tool failure rate (platform failures and truncation are not the agent's).
    failure_rate = {t: [finite(m.get(f"tools/{t}/failure_rate")) for m in lines] for t in tools}
    return ToolSeries([int(m["step"]) for m in lines], calls, failure_rate, class_rate)
