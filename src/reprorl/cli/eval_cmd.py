"""`reprorl eval`: measure a run's weights (final or a checkpoint) or a trained adapter on frozen suites."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.config import load_spec, resolve_spec
from reprorl.store import find_run

# The figures the table shows per suite; --json has every one.
SHOWN = (
    "success",
    "partial_credit",
    "invalid_calls_mean",
    "extra_steps",
    "completion_tokens_mean",
    "cost_usd",
)


def eval_(
    ctx: typer.Context,
    target: str = typer.Argument(
        ...,
        help="A run id (or unique prefix), a trained adapter (calc-demo-adapter@v1), or a base model "
        "(with --spec).",
    ),
    suites: list[str] = typer.Option(..., "--suite", help="A frozen suite NAME@VERSION; repeat for more."),
    step: int | None = typer.Option(
        None, "--step", min=0, help="A run checkpoint's step instead of its final weights."
    ),
    seed: int | None = typer.Option(
        None, "--seed", help="Eval seed (default: the run's seed, as in its loop)."
    ),
    samples: int | None = typer.Option(
        None, "--samples", min=1, help="Samples per task (default: the run's)."
    ),
    spec_file: Path | None = typer.Option(
        None,
        "--spec",
        dir_okay=False,
        help="Run spec whose sampling, env settings and seed a base model uses.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: every figure of every suite."),
) -> None:
    """Evaluate weights on frozen suites through the training loop's own eval path (same numbers)."""
    from reprorl.orchestrate.jobs.evaluate import evaluate_target

    store = options(ctx).store()
    settings = (
        resolve_spec(load_spec(spec_file, [], pin_bare=store.pin_newest), store.pin) if spec_file else None
    )
    if "@" not in target and not target.startswith("sha256:"):
        target = find_run(store, target).run_id
    result = asyncio.run(
        evaluate_target(
            store, target, suites, step=step, seed=seed, samples_per_task=samples, settings=settings
        )
    )
    report: dict[str, Any] = {
        "target": result.target,
        "policy_version": result.policy_version,
        "seed": result.seed,
        "suites": [
            {
                "suite": ref,
                "name": p.suite,
                "metrics": {k.split("/", 2)[2]: v for k, v in p.metrics().items()},
            }
            for ref, p in zip(suites, result.points, strict=True)
        ],
    }
    if as_json:
        print_json(report)
        return
    table = Table(title=f"{result.target}  ({result.policy_version[:28]}…, seed {result.seed})")
    table.add_column("suite")
    for name in SHOWN:
        table.add_column(name, justify="right")
    for entry in report["suites"]:
        m = entry["metrics"]
        cells = [entry["suite"]]
        for name in SHOWN:
            if name not in m:
                cells.append("-")
            elif f"{name}_low" in m:
                cells.append(f"{m[name]:.3f} [{m[name + '_low']:.2f}, {m[name + '_high']:.2f}]")
            else:
                cells.append(f"{m[name]:.3g}")
        table.add_row(*cells)
    console.print(table)
