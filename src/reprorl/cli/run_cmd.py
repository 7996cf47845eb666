"""`reprorl run`: train a run spec end to end and record everything; `--resume` continues a killed run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console
from reprorl.config import RunSpec, load_spec, resolve_spec
from reprorl.errors import UserInputError
from reprorl.store import RunRecord


def run(
    ctx: typer.Context,
    file: Path | None = typer.Argument(None, help="Run spec (TOML).", dir_okay=False),
    overrides: list[str] | None = typer.Argument(None, help="Dotted overrides, e.g. learning.steps=5."),
    resume: str | None = typer.Option(
        None, "--resume", metavar="RUN", help="Continue this run from its newest checkpoint."
    ),
) -> None:
    """SFT warm start (if the spec asks), then policy-gradient steps; records, metrics, adapter."""
    from reprorl.orchestrate.train import train_run

    store = options(ctx).store()
    if resume is not None:
        if file is not None or overrides:
            raise UserInputError(
                "--resume takes the spec from the run's record; drop the spec file and overrides"
            )
        record = RunRecord(store, resume)
        status = record.status()["status"]
        if status == "succeeded":
            raise UserInputError(
                f"run {resume} already finished (status succeeded); there is nothing to resume"
            )
        spec = RunSpec.model_validate(record.spec())
        console.print(f"resuming run {resume} (was {status})")
        record = asyncio.run(train_run(store, spec, resume=record, show_progress=True))
    else:
        if file is None:
            raise UserInputError("give a run spec file, or --resume RUN", field="FILE")
        spec = resolve_spec(load_spec(file, overrides or [], pin_bare=store.pin_newest), store.pin)
        record = asyncio.run(train_run(store, spec, show_progress=True))
    status = record.status()
    if status["status"] == "stopped":
        console.print(f"run {record.run_id} stopped: {status.get('reason', 'a rollback rule fired')}")
    else:
        console.print(f"run {record.run_id} finished")
    console.print(f"see it with: reprorl runs show {record.run_id}")
