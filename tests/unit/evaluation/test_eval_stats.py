"""Eval statistics: Wilson, bootstrap coverage, clustered SE, paired tests, pass@k and pass^k."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from reprorl.evaluation import (
    Estimate,
    clustered_mean_ci,
    intervals_overlap,
    mean_ci,
    mean_pass_at_k,
    mean_pass_hat_k,
    paired_difference,
    pass_at_k,
    pass_at_k_by_task,
    pass_hat_k,
    proportion_ci,
    t_quantile,
)


def test_wilson_interval_matches_hand_computation_for_8_of_10() -> None:
    # z = 1.959964; p = 0.8; centre = (0.8 + z²/20) / (1 + z²/10); half = z/(1 + z²/10) · √(0.016 + z²/400)
    z = 1.959963984540054
    centre = (0.8 + z * z / 20) / (1 + z * z / 10)
    half = z / (1 + z * z / 10) * math.sqrt(0.8 * 0.2 / 10 + z * z / 400)
    est = proportion_ci(8, 10)
    assert est.value == 0.8 and est.n == 10
    assert est.low == pytest.approx(centre - half, abs=1e-12)
    assert est.high == pytest.approx(centre + half, abs=1e-12)
    assert (round(est.low, 4), round(est.high, 4)) == (0.4902, 0.9433)  # the published figures
    assert str(est) == "0.800 [0.49, 0.94] n=10"


def test_wilson_is_sound_at_zero_and_all() -> None:
    none, every = proportion_ci(0, 10), proportion_ci(10, 10)
    assert none.low == 0.0 and 0.2 < none.high < 0.35
    assert every.high == 1.0 and 0.65 < every.low < 0.8
    assert none.high == pytest.approx(1 - every.low)
    with pytest.raises(ValueError, match="successes"):
        proportion_ci(11, 10)


def test_t_quantiles_match_the_table() -> None:
    table = {1: 12.7062, 2: 4.3027, 4: 2.7764, 5: 2.5706, 10: 2.2281, 30: 2.0423}
    for df, expected in table.items():
        assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert t_quantile(0.025, 10) == pytest.approx(-2.2281, abs=1e-4)
    assert t_quantile(0.95, 7) == pytest.approx(1.8946, abs=1e-4)


def test_bootstrap_ci_covers_the_true_mean_in_at_least_90_of_100_simulations() -> None:
    rng = np.random.default_rng(12345)
    covered = 0
    widths = []
    for sim in range(100):
        values = rng.normal(0.6, 0.25, size=40)
        est = mean_ci(values.tolist(), resamples=1000, seed=sim)
        covered += est.low <= 0.6 <= est.high
        widths.append(est.high - est.low)
    assert covered >= 90
    # Not trivially wide either: about 2 · 1.96 · 0.25/√40 ≈ 0.155.
    assert 0.12 < float(np.mean(widths)) < 0.19


def test_bootstrap_is_deterministic_given_the_seed_and_normal_matches_t() -> None:
    values = [0.1, 0.9, 0.4, 0.7, 0.3, 0.8, 0.5]
    assert mean_ci(values, seed=3) == mean_ci(values, seed=3)
    assert mean_ci(values, seed=3) != mean_ci(values, seed=4)
    est = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0], method="normal")
    half = 2.7764451 * math.sqrt(2.5 / 5)  # t(0.975, 4) · s/√n, s² = 2.5
    assert (est.low, est.high) == (pytest.approx(3 - half), pytest.approx(3 + half))
    assert est.se == pytest.approx(math.sqrt(0.5))


def test_bootstrap_chunks_large_inputs_without_changing_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    import reprorl.evaluation.stats as stats

    values = np.random.default_rng(0).random(500).tolist()
    whole = mean_ci(values, resamples=300, seed=9)
    monkeypatch.setattr(stats, "_BLOCK_ELEMENTS", 500 * 7)  # blocks of 7 resamples
    assert mean_ci(values, resamples=300, seed=9) == whole


def test_clustered_se_matches_hand_computation_on_two_clusters() -> None:
    # Cluster A: 1, 1, 0, 1; cluster B: 0, 0. Mean 0.5; residual sums S_A = 1, S_B = -1.
    # CR1: SE² = G/(G-1) · (S_A² + S_B²) / N² = 2 · 2 / 36, so SE = 1/3; t(0.975, df=1) = 12.7062.
    est = clustered_mean_ci([1, 1, 0, 1, 0, 0], ["A", "A", "A", "A", "B", "B"])
    assert est.value == 0.5 and est.n == 6
    assert est.se == pytest.approx(1 / 3)
    assert est.high - est.value == pytest.approx(12.7062047 / 3)
    assert "CR1" in est.method and "2 clusters" in est.method
    # Labels may interleave; only membership matters.
    shuffled = clustered_mean_ci([1, 0, 1, 0, 0, 1], ["A", "B", "A", "A", "B", "A"])
    assert shuffled.se == pytest.approx(1 / 3)


def test_clustered_with_one_cluster_falls_back_and_says_so() -> None:
    values = [0.2, 0.4, 0.9, 0.5]
    est = clustered_mean_ci(values, ["math"] * 4)
    iid = mean_ci(values, method="normal")
    assert (est.low, est.high, est.se) == (iid.low, iid.high, iid.se)
    assert "1 cluster" in est.method
    with pytest.raises(ValueError, match="3 cluster labels"):
        clustered_mean_ci(values, ["a", "b", "c"])


def test_paired_difference_detects_a_planted_shift() -> None:
    rng = np.random.default_rng(7)
    tasks = [f"t{i}" for i in range(40)]
    base = rng.random(40)
    b = {t: float(x + rng.normal(0, 0.2)) for t, x in zip(tasks, base, strict=True)}
    a = {t: float(x + 0.3 + rng.normal(0, 0.2)) for t, x in zip(tasks, base, strict=True)}
    shifted = paired_difference(a, b, seed=1)
    assert shifted.p_value < 0.05
    assert shifted.estimate.low > 0 and shifted.estimate.low < 0.3 < shifted.estimate.high
    assert shifted.estimate.n == 40 and shifted.n_dropped == 0

    same = {t: float(x + rng.normal(0, 0.2)) for t, x in zip(tasks, base, strict=True)}
    null = paired_difference(same, b, seed=1)
    assert null.p_value > 0.05
    assert null.estimate.low < 0 < null.estimate.high


def test_sign_flip_p_value_is_exact_for_small_n() -> None:
    # Three positive differences: of the 8 sign patterns only all-plus and all-minus reach |mean| = 1.
    result = paired_difference({"x": 1.0, "y": 1.0, "z": 1.0}, {"x": 0.0, "y": 0.0, "z": 0.0})
    assert result.p_value == pytest.approx(2 / 8)


def test_mismatched_task_sets_are_refused_unless_partial_allowed() -> None:
    a = {"t1": 1.0, "t2": 0.0, "t3": 1.0, "t4": 1.0}
    b = {"t1": 0.0, "t2": 0.0, "t5": 1.0}
    with pytest.raises(ValueError, match="2 task ids only in a, 1 only in b"):
        paired_difference(a, b)
    partial = paired_difference(a, b, allow_partial=True)
    assert partial.estimate.n == 2 and partial.estimate.value == 0.5
    assert (partial.n_dropped_a, partial.n_dropped_b, partial.n_dropped) == (2, 1, 3)


def _brute(n: int, c: int, k: int) -> tuple[float, float]:
    """Enumerate every k-subset of n samples (the first c correct): P(any correct), P(all correct)."""
    subsets = list(itertools.combinations(range(n), k))
    any_ok = sum(any(i < c for i in s) for s in subsets)
    all_ok = sum(all(i < c for i in s) for s in subsets)
    return any_ok / len(subsets), all_ok / len(subsets)


def test_pass_at_k_and_pass_hat_k_match_brute_force_enumeration() -> None:
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                at, hat = _brute(n, c, k)
                assert pass_at_k(n, c, k) == pytest.approx(at, abs=1e-12), (n, c, k)
                assert pass_hat_k(n, c, k) == pytest.approx(hat, abs=1e-12), (n, c, k)


def test_pass_estimators_closed_forms_and_large_n_stability() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_hat_k(10, 3, 2) == pytest.approx(3 / 45)
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - math.comb(7, 2) / math.comb(10, 2))
    # Large n where the binomials overflow floats: the product form stays in [0, 1].
    assert pass_at_k(2000, 1000, 100) == pytest.approx(1 - math.comb(1000, 100) / math.comb(2000, 100))
    assert pass_hat_k(2000, 1000, 100) == pytest.approx(math.comb(1000, 100) / math.comb(2000, 100))
    with pytest.raises(ValueError, match="k must be"):
        pass_at_k(3, 1, 4)


def test_per_task_averages_weigh_tasks_equally() -> None:
    counts = {"easy": (4, 4), "hard": (10, 0), "half": (2, 1)}
    assert pass_at_k_by_task(counts, 1) == {"easy": 1.0, "hard": 0.0, "half": 0.5}
    assert mean_pass_at_k(counts, 1) == pytest.approx(0.5)
    assert mean_pass_hat_k(counts, 2) == pytest.approx((1.0 + 0.0 + 0.0) / 3)
    assert mean_pass_at_k(counts, 2) == pytest.approx((1.0 + 0.0 + 1.0) / 3)


def test_intervals_overlap() -> None:
    a = Estimate(0.5, 0.4, 0.6, 10, "x")
    assert intervals_overlap(a, Estimate(0.65, 0.6, 0.7, 10, "x"))  # touching counts
    assert not intervals_overlap(a, Estimate(0.8, 0.7, 0.9, 10, "x"))
    assert not intervals_overlap(Estimate(0.1, 0.0, 0.2, 10, "x"), a)
    assert intervals_overlap(a, mean_ci([0.9]))  # undefined interval: can't tell them apart
