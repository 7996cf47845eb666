"""`reprorl run`: train a run spec end to end on this machine and record everything."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console
from reprorl.config import load_spec, resolve_spec


def run(
    ctx: typer.Context,
    file: Path = typer.Argument(..., help="Run spec (TOML).", dir_okay=False),
    overrides: list[str] | None = typer.Argument(None, help="Dotted overrides, e.g. learning.steps=5."),
) -> None:
    """SFT warm start (if the spec asks), then policy-gradient steps; records, metrics, adapter."""
    from reprorl.orchestrate.train import train_run

    store = options(ctx).store()
    spec = resolve_spec(load_spec(file, overrides or [], pin_bare=store.pin_newest), store.pin)
    record = asyncio.run(train_run(store, spec))
    console.print(f"run {record.run_id} finished; see it with: reprorl runs show {record.run_id}")
