"""`reprorl tasks regression`: grow a regression suite from a run's failed rollouts (a new suite version)."""

from __future__ import annotations

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console
from reprorl.store import find_run

# Held-out rollouts the agent failed (infrastructure failures are not the agent's).
FAILED = (
    "split != 'train' AND termination != 'infra_error' "
    "AND coalesce(reward_components['outcome'], 0) < 1 AND NOT retried"
)


def regression(
    ctx: typer.Context,
    suite: str = typer.Argument(..., help="The regression suite's name (created if new)."),
    run: str = typer.Option(..., "--run", help="The run whose rollouts to take (id or unique prefix)."),
    where: str = typer.Option(
        FAILED, "--where", help="SQL condition picking the rollouts (docs/rollouts.md)."
    ),
) -> None:
    """Add the tasks of the matching rollouts to SUITE as `regression` cases: its next version."""
    from reprorl.orchestrate.jobs.regression import failed_tasks, grow_suite

    store = options(ctx).store()
    tasks = failed_tasks(store, find_run(store, run), where)
    grown = grow_suite(store, suite, tasks)
    new = len(grown.added)
    console.print(
        f"{grown.suite}: {grown.total} cases ({new} new of {len(tasks)} matching task(s))"
        if new
        else f"{grown.suite}: unchanged, it already holds all {len(tasks)} matching task(s)"
    )
