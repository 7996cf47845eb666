"""`reprorl runs export-metrics` and `export-adapter`: a run's records and weights, for other tools."""

from __future__ import annotations

from pathlib import Path

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


def export_adapter_cmd(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="Run id or a unique prefix of it."),
    out: Path = typer.Option(..., "--out", "-o", help="A new folder to write the peft adapter into."),
    copy_base: bool = typer.Option(
        False, "--copy-base", help="Write the base model into the folder too, so it stands alone."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Export the run's adapter as a plain peft folder: AutoPeftModelForCausalLM.from_pretrained(OUT)."""
    from reprorl.orchestrate.jobs.export_adapter import export_adapter  # torch loads only here

    exported = export_adapter(options(ctx).store(), run, out, copy_base=copy_base)
    if as_json:
        print_json(exported.to_json())
        return
    console.print(f"{exported.run_id} adapter {exported.adapter_hash} → {exported.folder}")
    console.print(f"base: {exported.base_model_path} ({exported.base_model_hash})")
