"""`reprorl reproduce`: re-run a run from its records and name every difference from the original."""

from __future__ import annotations

import asyncio

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.store import find_run

SHOWN = 20


def reproduce(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="The run to reproduce (id or unique prefix)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Train the run's recorded spec again; compare metrics and final weights (exit 1 if they differ)."""
    from reprorl.orchestrate.jobs.reproduce import reproduce_run

    store = options(ctx).store()
    result = asyncio.run(reproduce_run(store, find_run(store, run).run_id, show_progress=not as_json))
    if as_json:
        print_json(result.to_json())
    else:
        for warning in (*result.code_warnings, *result.timing_dependent):
            console.print(f"[yellow]warning:[/] {warning}")
        if result.followed is not None:
            console.print(f"followed the recorded schedule: {result.followed}")
        if result.diverged is not None:
            console.print(f"[yellow]warning:[/] the rerun left the recorded schedule at {result.diverged}")
        verdict = "[green]reproduced exactly[/]" if result.matches else "[red]differs[/]"
        console.print(
            f"{result.rerun} against {result.original}: {verdict} "
            f"({result.lines_compared} metric lines, final weights {result.adapter[1] or 'none'})"
        )
        for d in result.differences[:SHOWN]:
            where = "weights" if d.line < 0 else f"metrics line {d.line}"
            console.print(f"  {where} {d.key}: {d.original!r} then, {d.rerun!r} now")
        if len(result.differences) > SHOWN:
            console.print(f"  … and {len(result.differences) - SHOWN} more (--json lists all)")
    if not result.matches:
        raise typer.Exit(1)
