"""`reprorl runs report`: one self-contained HTML report of a run, written from its records."""

from __future__ import annotations

from pathlib import Path

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json


def report(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="The run (id or unique prefix)."),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Where to write the HTML (default: report.html in the run's folder)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Write RUN's report: curves with 95% intervals, health, tools, cost, evals, guards, sample rollouts."""
    from reprorl.report import render_report

    result = render_report(options(ctx).store(), run, output)
    if as_json:
        print_json(result.to_json())
        return
    empty = [s["title"] for s in result.sections if not s["has_data"]]
    console.print(f"{result.path}")
    console.print(
        f"{len(result.sections)} sections, {result.charts} charts, {result.bytes / 1e6:.1f} MB"
        + (f"; no data for: {', '.join(str(t) for t in empty)}" if empty else "")
    )
