"""Uncertainty for eval figures: every score is reported as an `Estimate` with an interval and its n.

Pure functions on sequences of floats (stdlib + numpy, no scipy); anything random takes a `seed` and
uses `numpy.random.default_rng(seed)`, so the same inputs give the same interval.

- `mean_ci`: mean with a percentile-bootstrap (default) or normal-theory (Student t) interval.
- `proportion_ci`: Wilson score interval for successes out of n (sound at 0/n and n/n).
- `clustered_mean_ci`: mean with a cluster-robust (CR1) standard error, clusters = env family.
- `paired_difference`: a - b over the same task ids, bootstrap interval and sign-flip p-value.
- `pass_at_k` / `pass_hat_k`: unbiased per-task estimators, and their task averages.
- `intervals_overlap`: whether two estimates' intervals share a point.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = [
    "Estimate",
    "PairedDifference",
    "clustered_mean_ci",
    "intervals_overlap",
    "mean_ci",
    "mean_pass_at_k",
    "mean_pass_hat_k",
    "paired_difference",
    "pass_at_k",
    "pass_at_k_by_task",
    "pass_hat_k",
    "pass_hat_k_by_task",
    "proportion_ci",
    "t_quantile",
]

# Elements of one resample block (int64 indices or float signs): about 32 MiB, whatever n is.
_BLOCK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class Estimate:
    """A point value, its interval [low, high] at the stated confidence, the sample size, and how.

    `low`/`high` are NaN when the interval is undefined (fewer than two observations); `se` is the
    standard error where the method has one (normal-theory and clustered), else None.
    """

    value: float
    low: float
    high: float
    n: int
    method: str
    confidence: float = 0.95
    se: float | None = None

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.2f}, {self.high:.2f}] n={self.n}"


@dataclass(frozen=True)
class PairedDifference:
    """Mean of a - b over shared task ids, with a two-sided paired sign-flip permutation p-value."""

    estimate: Estimate
    p_value: float
    n_dropped_a: int = 0
    n_dropped_b: int = 0

    @property
    def n_dropped(self) -> int:
        return self.n_dropped_a + self.n_dropped_b

    def __str__(self) -> str:
        dropped = f" ({self.n_dropped} unpaired dropped)" if self.n_dropped else ""
        return f"{self.estimate} p={self.p_value:.3g}{dropped}"


# --------------------------------------------------------------------------- quantiles


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction for the regularized incomplete beta (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            delta = d * c
            h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _beta_inc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _beta_inc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (normal when df is infinite)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"df must be positive, got {df}")
    if math.isinf(df):
        return NormalDist().inv_cdf(p)
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, max(1.0, 2 * NormalDist().inv_cdf(p))
    while _t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):  # bisection: the cdf is monotone, and this is never on a hot path
        mid = 0.5 * (lo + hi)
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-13 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# --------------------------------------------------------------------------- means and proportions


def _as_array(values: Sequence[float]) -> npt.NDArray[np.float64]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"expected a flat sequence of numbers, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("no values: an estimate needs at least one observation")
    if not np.all(np.isfinite(arr)):
        raise ValueError("values must be finite (NaN or inf found)")
    return arr


def _bootstrap_means(
    arr: npt.NDArray[np.float64], resamples: int, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """Means of `resamples` with-replacement resamples, drawn in blocks of bounded size."""
    n = arr.size
    block = max(1, min(resamples, _BLOCK_ELEMENTS // n))
    means = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, block):
        stop = min(resamples, start + block)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = arr[idx].mean(axis=1)
    return means


def mean_ci(
    values: Sequence[float],
    *,
    confidence: float = 0.95,
    method: Literal["bootstrap", "normal"] = "bootstrap",
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """Mean of `values` with a percentile-bootstrap or normal-theory interval.

    "normal" uses the standard error with Student's t quantile on n - 1 degrees of freedom (the
    normal quantile's small-sample form). With one value the interval is undefined (NaN).
    """
    _check_confidence(confidence)
    arr = _as_array(values)
    n = int(arr.size)
    value = float(arr.mean())
    alpha = 1.0 - confidence
    if n < 2:
        return Estimate(value, math.nan, math.nan, n, f"{method} (undefined for n=1)", confidence)
    if method == "normal":
        se = float(arr.std(ddof=1)) / math.sqrt(n)
        half = t_quantile(1.0 - alpha / 2.0, n - 1) * se
        return Estimate(value, value - half, value + half, n, f"normal (t, df={n - 1})", confidence, se)
    if method == "bootstrap":
        if resamples < 1:
            raise ValueError(f"resamples must be at least 1, got {resamples}")
        means = _bootstrap_means(arr, resamples, np.random.default_rng(seed))
        low, high = np.quantile(means, [alpha / 2.0, 1.0 - alpha / 2.0])
        name = f"percentile bootstrap ({resamples} resamples, seed={seed})"
        return Estimate(value, float(low), float(high), n, name, confidence)
    raise ValueError(f"unknown method {method!r}: expected 'bootstrap' or 'normal'")


def proportion_ci(successes: int, n: int, confidence: float = 0.95) -> Estimate:
    """Success rate `successes / n` with the Wilson score interval (stays in [0, 1], sound at 0/n, n/n)."""
    _check_confidence(confidence)
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    z = NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)
    p = successes / n
    z2n = z * z / n
    centre = (p + z2n / 2.0) / (1.0 + z2n)
    half = z / (1.0 + z2n) * math.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n))
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Estimate(p, low, high, n, "wilson", confidence)


def clustered_mean_ci(
    values: Sequence[float], clusters: Sequence[Hashable], confidence: float = 0.95
) -> Estimate:
    """Mean with a cluster-robust standard error (CR1), for scores that are correlated within a cluster.

    SE² = G/(G-1) · Σ_g (Σ_{i∈g} (y_i - ȳ))² / N², the CR1 sandwich for a mean (its (N-1)/(N-K) factor is
    1 with K = 1); the interval uses Student's t on G - 1 degrees of freedom, so few clusters give
    honestly wide intervals. With one cluster the robust SE is undefined: it falls back to the i.i.d.
    t interval and says so in `method`.
    """
    _check_confidence(confidence)
    arr = _as_array(values)
    if len(clusters) != arr.size:
        raise ValueError(f"{arr.size} values but {len(clusters)} cluster labels")
    n = int(arr.size)
    value = float(arr.mean())
    labels: dict[Hashable, int] = {}
    codes = np.fromiter((labels.setdefault(c, len(labels)) for c in clusters), dtype=np.intp, count=n)
    g = len(labels)
    if g < 2:
        iid = mean_ci(arr.tolist(), confidence=confidence, method="normal")
        method = f"{iid.method}; 1 cluster, so i.i.d. SE (cluster-robust SE undefined)"
        return Estimate(value, iid.low, iid.high, n, method, confidence, iid.se)
    sums = np.bincount(codes, weights=arr - value, minlength=g)
    se = math.sqrt(g / (g - 1) * float(np.sum(sums * sums))) / n
    half = t_quantile(1.0 - (1.0 - confidence) / 2.0, g - 1) * se
    method = f"cluster-robust CR1 ({g} clusters, t df={g - 1})"
    return Estimate(value, value - half, value + half, n, method, confidence, se)


# --------------------------------------------------------------------------- paired comparison


def _sign_flip_p_value(diffs: npt.NDArray[np.float64], permutations: int, rng: np.random.Generator) -> float:
    """Two-sided p-value for mean(diffs) = 0 under random sign flips (exact when 2^n ≤ permutations)."""
    n = diffs.size
    observed = abs(float(diffs.mean()))
    tol = 1e-12 * max(1.0, observed)
    if n <= 20 and 2**n <= permutations:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)), dtype=np.float64)
        stats = np.abs(signs @ diffs) / n
        return int(np.count_nonzero(stats >= observed - tol)) / int(signs.shape[0])
    block = max(1, min(permutations, _BLOCK_ELEMENTS // n))
    extreme = 0
    for start in range(0, permutations, block):
        size = min(block, permutations - start)
        signs = rng.integers(0, 2, size=(size, n)).astype(np.float64) * 2.0 - 1.0
        stats = np.abs(signs @ diffs) / n
        extreme += int(np.count_nonzero(stats >= observed - tol))
    # +1 in both: the observed labelling is one of the permutations, so p is never 0.
    return (extreme + 1) / (permutations + 1)


def paired_difference(
    a: Mapping[str, float],
    b: Mapping[str, float],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    permutations: int = 10000,
    seed: int = 0,
    allow_partial: bool = False,
) -> PairedDifference:
    """Mean of a[t] - b[t] over task ids t, with a bootstrap interval and a sign-flip permutation p-value.

    Both mappings must cover the same task ids; otherwise ValueError, unless `allow_partial`, which
    uses the shared ids and reports how many were dropped from each side.
    """
    only_a = a.keys() - b.keys()
    only_b = b.keys() - a.keys()
    if (only_a or only_b) and not allow_partial:
        shared_count = len(a.keys() & b.keys())
        raise ValueError(
            f"task sets differ: {len(only_a)} task ids only in a, {len(only_b)} only in b "
            f"({shared_count} shared); pass allow_partial=True to compare the shared ones"
        )
    shared = sorted(a.keys() & b.keys())
    if not shared:
        raise ValueError("no task ids in common: nothing to compare")
    if permutations < 1:
        raise ValueError(f"permutations must be at least 1, got {permutations}")
    diffs = _as_array([a[t] - b[t] for t in shared])
    est = mean_ci(diffs.tolist(), confidence=confidence, resamples=resamples, seed=seed)
    # A separate stream so the p-value does not depend on how many bootstrap draws came first.
    p = _sign_flip_p_value(diffs, permutations, np.random.default_rng([seed, 1]))
    method = f"paired difference a - b; {est.method}; sign-flip test"
    estimate = Estimate(est.value, est.low, est.high, est.n, method, confidence)
    return PairedDifference(estimate, p, len(only_a), len(only_b))


# --------------------------------------------------------------------------- pass@k, pass^k


def _check_nck(n: int, c: int, k: int) -> None:
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}] (can't estimate pass@{k} from {n} samples)")


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k draws without replacement from n samples, c correct, is correct).

    The unbiased estimator of Chen et al. 2021: 1 - C(n-c, k)/C(n, k), as the stable product
    1 - Π_{i=n-c+1}^{n} (1 - k/i).
    """
    _check_nck(n, c, k)
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_hat_k(n: int, c: int, k: int) -> float:
    """P(all k draws without replacement from n samples, c correct, are correct): pass^k.

    The unbiased estimator C(c, k)/C(n, k) of Yao et al. 2024 (τ-bench), as Π_{i=0}^{k-1} (c-i)/(n-i).
    """
    _check_nck(n, c, k)
    if c < k:
        return 0.0
    prod = 1.0
    for i in range(k):
        prod *= (c - i) / (n - i)
    return prod


def pass_at_k_by_task(counts: Mapping[str, tuple[int, int]], k: int) -> dict[str, float]:
    """pass@k per task from `{task_id: (n, c)}`; the result feeds `mean_ci` or `paired_difference`."""
    return {task: pass_at_k(n, c, k) for task, (n, c) in counts.items()}


def pass_hat_k_by_task(counts: Mapping[str, tuple[int, int]], k: int) -> dict[str, float]:
    """pass^k per task from `{task_id: (n, c)}`."""
    return {task: pass_hat_k(n, c, k) for task, (n, c) in counts.items()}


def mean_pass_at_k(counts: Mapping[str, tuple[int, int]], k: int) -> float:
    """pass@k averaged over tasks (each task weighs the same, whatever its n)."""
    if not counts:
        raise ValueError("no tasks")
    return math.fsum(pass_at_k_by_task(counts, k).values()) / len(counts)


def mean_pass_hat_k(counts: Mapping[str, tuple[int, int]], k: int) -> float:
    """pass^k averaged over tasks (each task weighs the same, whatever its n)."""
    if not counts:
        raise ValueError("no tasks")
    return math.fsum(pass_hat_k_by_task(counts, k).values()) / len(counts)


# --------------------------------------------------------------------------- comparing estimates


def intervals_overlap(a: Estimate, b: Estimate) -> bool:
    """Whether the two intervals share a point; an undefined (NaN) interval counts as overlapping.

    Overlap does not mean "no difference": compare paired runs with `paired_difference`.
    """
    if any(math.isnan(x) for x in (a.low, a.high, b.low, b.high)):
        return True
    return a.low <= b.high and b.low <= a.high
