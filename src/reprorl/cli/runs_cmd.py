"""`reprorl runs list` and `reprorl runs show`: the recorded runs, and one run's conditions."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.store import RunRecord, find_run, iter_runs


def summarise(record: RunRecord) -> dict[str, Any]:
    info = record.info()
    metrics = record.metrics()
    events = record.events()
    env = info["environment"]
    code = env["code"].get("cwd") or env["code"].get("reprorl") or {}
    return {
        "run_id": record.run_id,
        "name": info["name"],
        "status": record.status(),
        "spec_hash": info["spec_hash"],
        "seeds": info["seeds"],
        "inputs": info["inputs"],
        "created_at": info["created_at"],
        "code": {k: code.get(k) for k in ("commit", "dirty")},
        "python": env["python"].split()[0],
        "platform": env["platform"],
        "cpu": env["cpu"],
        "gpus": env["gpus"],
        "metrics": {
            "records": len(metrics.records),
            "bad_lines": metrics.bad_lines,
            "last": metrics.records[-1] if metrics.records else None,
        },
        "events": {"records": len(events.records), "bad_lines": events.bad_lines},
        "path": str(record.path),
    }


def list_(
    ctx: typer.Context,
    limit: int = typer.Option(50, min=1, help="Show at most this many, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List runs, newest first."""
    store = options(ctx).store()
    rows = []
    for run_id in list(iter_runs(store))[:limit]:
        record = RunRecord(store, run_id)
        info, status = record.info(), record.status()
        rows.append(
            {
                "run_id": run_id,
                "name": info["name"],
                "status": status["status"],
                "spec_hash": info["spec_hash"],
                "created_at": info["created_at"],
            }
        )
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print(f"no runs under {store.runs_dir}")
        return
    table = Table("run", "name", "status", "spec", "created")
    for row in rows:
        table.add_row(
            row["run_id"],
            row["name"],
            row["status"],
            row["spec_hash"][:19] + "…",
            row["created_at"][:19],
        )
    console.print(table)


def show(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="Run id or a unique prefix of it."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show a run's conditions and progress from its records."""
    summary = summarise(find_run(options(ctx).store(), run))
    if as_json:
        print_json(summary)
        return
    status = summary["status"]
    lines = [
        ("run", summary["run_id"]),
        ("name", summary["name"]),
        (
            "status",
            status["status"] + (f" (ended {status['ended_at']})" if status.get("ended_at") else ""),
        ),
        ("spec", summary["spec_hash"]),
        ("seeds", ", ".join(f"{k}={v}" for k, v in summary["seeds"].items())),
        (
            "code",
            f"{summary['code']['commit'] or 'no git commit'}{' (dirty)' if summary['code']['dirty'] else ''}",
        ),
        ("python", summary["python"]),
        ("platform", summary["platform"]),
        ("cpu", f"{summary['cpu']['model']} x{summary['cpu']['count']}"),
        ("gpus", ", ".join(summary["gpus"]) or "none"),
        (
            "metrics",
            f"{summary['metrics']['records']} records"
            + (
                f", {len(summary['metrics']['bad_lines'])} damaged lines"
                if summary["metrics"]["bad_lines"]
                else ""
            ),
        ),
        ("events", f"{summary['events']['records']} records"),
        ("path", summary["path"]),
    ]
    for role, ref in sorted(summary["inputs"].items()):
        lines.append((f"in:{role}", ref))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        console.print(f"{key:<{width}}  {value}")
