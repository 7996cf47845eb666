"""`reprorl runs export-metrics`: replay a run's recorded metrics and events into TensorBoard, MLflow, W&B."""

from __future__ import annotations

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.errors import UserInputError
from reprorl.sinks import export_run, parse_targets
from reprorl.store import find_run


def export_metrics(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="Run id or a unique prefix of it."),
    to: list[str] | None = typer.Option(
        None,
        "--to",
        metavar="KIND:DIR",
        help="tensorboard:DIR, mlflow:DIR (or a tracking URI) or wandb:DIR; repeatable.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Write the run's metrics.jsonl and events.jsonl into each sink, as a new run of that sink."""
    targets = parse_targets(to, option="--to")
    if not targets:
        raise UserInputError("give at least one KIND:DIR, e.g. --to tensorboard:runs/tb", field="--to")
    record = find_run(options(ctx).store(), run)
    result = export_run(record, targets)
    if as_json:
        print_json(result.to_json())
        return
    skipped = f" ({result.bad_lines} damaged lines left out)" if result.bad_lines else ""
    for label in result.sinks:
        console.print(
            f"{record.run_id} → {label}: {result.metric_lines} metric lines, {result.events} events{skipped}"
        )
