"""Acceptance thresholds on an eval point's figures."""

from __future__ import annotations

from reprorl.evaluation.acceptance import acceptance


def test_every_threshold_is_checked_and_all_must_hold() -> None:
    figures = {"success": 0.62, "partial_credit": 0.7}
    assert acceptance({}, figures) == {}
    assert acceptance({"success": 0.6}, figures) == {"accepted": 1.0, "accept/success": 1.0}
    both = acceptance({"success": 0.6, "partial_credit": 0.75}, figures)
    assert both == {"accepted": 0.0, "accept/partial_credit": 0.0, "accept/success": 1.0}
    assert acceptance({"success": 0.62}, figures)["accepted"] == 1.0  # the minimum itself passes


def test_a_figure_the_suite_does_not_report_fails_its_check() -> None:
    assert acceptance({"extra_steps": 0.0}, {"success": 1.0}) == {"accepted": 0.0, "accept/extra_steps": 0.0}
    assert acceptance({"success": 0.1}, {"success": float("nan")})["accepted"] == 0.0
