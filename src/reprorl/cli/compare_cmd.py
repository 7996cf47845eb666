"""`reprorl runs compare`: two runs on one frozen suite, as a paired difference on the same tasks."""

from __future__ import annotations

import typer
from rich.table import Table

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.store import find_run


def compare(
    ctx: typer.Context,
    run_a: str = typer.Argument(..., help="The baseline run (id or unique prefix)."),
    run_b: str = typer.Argument(..., help="The run compared with it."),
    suite: str = typer.Option(..., "--suite", help="The suite, NAME@VERSION (or NAME: whatever both ran)."),
    both: bool = typer.Option(
        False, "--both", help="If the runs were measured on different versions, report each on its own."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Success of RUN_B minus RUN_A on the same suite version: interval and paired p-value."""
    from reprorl.orchestrate.jobs.compare import compare_runs

    store = options(ctx).store()
    result = compare_runs(store, find_run(store, run_a), find_run(store, run_b), suite, both=both)
    if as_json:
        print_json(result.to_json())
        return
    table = Table(title=f"suite {suite}")
    for name in ("run", "suite version", "step", "tasks", "success [95% CI]"):
        table.add_column(name)
    for side in (result.a, result.b):
        s = side.success
        table.add_row(
            side.run_id,
            side.version,
            str(side.step),
            str(len(side.per_task)),
            f"{s.value:.3f} [{s.low:.2f}, {s.high:.2f}]",
        )
    console.print(table)
    if result.difference is None:
        console.print("[bold red]not comparable:[/] the runs were measured on different suite versions")
        return
    d = result.difference
    console.print(
        f"B - A: {d.estimate.value:+.3f} [{d.estimate.low:+.2f}, {d.estimate.high:+.2f}]  "
        f"p = {d.p_value:.3g}  (paired over {len(result.a.per_task)} tasks)"
    )
