"""Evaluation: the statistics every eval figure is reported with (intervals, paired tests, pass@k)."""

from reprorl.evaluation.stats import (
    Estimate,
    PairedDifference,
    clustered_mean_ci,
    intervals_overlap,
    mean_ci,
    mean_pass_at_k,
    mean_pass_hat_k,
    paired_difference,
    pass_at_k,
    pass_at_k_by_task,
    pass_hat_k,
    pass_hat_k_by_task,
    proportion_ci,
    t_quantile,
)

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
