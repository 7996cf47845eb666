"""`reprorl sample`: record a spec's policy acting on its train tasks, without training."""

from __future__ import annotations

from pathlib import Path

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console
from reprorl.config import load_spec, resolve_spec


def sample(
    ctx: typer.Context,
    file: Path = typer.Argument(..., help="Run spec (TOML).", dir_okay=False),
    overrides: list[str] | None = typer.Argument(None, help="Dotted overrides, e.g. learning.group_size=4."),
    steps: int = typer.Option(1, "--steps", min=1, help="Steps of groups to sample."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Sample groups of rollouts from the spec's policy and record them as a run."""
    # torch and transformers load only for this command, so the rest of the CLI starts quickly.
    from reprorl.orchestrate.jobs.sample import sample_run_sync

    store = options(ctx).store()
    spec = resolve_spec(load_spec(file, overrides or [], pin_bare=store.pin_newest), store.pin)
    record = sample_run_sync(store, spec, steps=steps, show_progress=progress)
    console.print(
        f"run {record.run_id}: sampled {steps} step(s); query with: reprorl runs rollouts {record.run_id}"
    )
