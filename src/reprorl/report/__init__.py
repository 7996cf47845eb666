"""The run report: one self-contained HTML file of a run's curves, health, tools, cost, evals and samples."""

from reprorl.report.render import REPORT_FILE, Report, ReportResult, build_report, render_report

__all__ = ["REPORT_FILE", "Report", "ReportResult", "build_report", "render_report"]
