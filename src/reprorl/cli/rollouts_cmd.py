"""`reprorl runs rollouts` and `runs compact`: query a run's rollout records with a SQL condition, and
merge an ended run's parts."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.store import find_run

# The table shows what answers "what happened"; --json and --columns reach every column.
TABLE_COLUMNS = (
    "step",
    "rollout_id",
    "task_id",
    "split",
    "termination",
    "reward_total",
    "n_turns",
    "tool_outcomes",
    "wall_s",
)
MAX_CELL = 48


def rollouts(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="Run id or a unique prefix of it."),
    where: str | None = typer.Option(
        None,
        "--where",
        help="SQL condition on the rollout columns, e.g. \"termination='tool_timeout'\" "
        "(columns: docs/rollouts.md).",
    ),
    columns: str | None = typer.Option(
        None, "--columns", help="Comma-separated columns to show (default: a summary; all with --json)."
    ),
    limit: int = typer.Option(50, "--limit", min=0, help="Show at most this many rows."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: a list of rows."),
) -> None:
    """Rollouts of a run matching a SQL condition, ordered by step and rollout id."""
    # pyarrow and DuckDB load only for this command, so the rest of the CLI starts quickly.
    from reprorl.store.rollout_query import RolloutStore

    record = find_run(options(ctx).store(), run)
    store = RolloutStore(record)
    selected = columns if columns is not None else (None if as_json else TABLE_COLUMNS)
    rows = json_rows(store.query(where, columns=selected, limit=limit).to_pylist())
    if as_json:
        print_json(rows)
        return
    if not rows:
        matched = store.count(where) if limit == 0 else 0
        if matched:
            console.print(
                f"{matched} rollouts{' match' if where else ''} in run {record.run_id} (--limit 0 shows none)"
            )
        else:
            console.print(f"no rollouts{' match' if where else ''} in run {record.run_id}")
        return
    table = Table(*rows[0].keys())
    for row in rows:
        table.add_row(*(cell(v) for v in row.values()))
    console.print(table)
    total = store.count(where) if len(rows) == limit else len(rows)
    if total > len(rows):
        console.print(f"{len(rows)} of {total} rollouts (--limit to show more)")
    else:
        console.print(f"{total} rollout{'s' if total != 1 else ''}")


def json_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Arrow gives a MAP column as (key, value) pairs; JSON readers expect an object."""
    return [{k: _maps_as_dicts(k, v) for k, v in row.items()} for row in rows]


def _maps_as_dicts(column: str, value: Any) -> Any:
    if column in ("reward_components", "tool_versions") and isinstance(value, list):
        return dict(value)
    return value


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        text = ", ".join(f"{k}={cell(v)}" for k, v in value.items())
    elif isinstance(value, list):
        text = ", ".join(
            f"{v.get('tool')}:{v.get('outcome')}" if isinstance(v, dict) else cell(v) for v in value
        )
    else:
        text = str(value)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def compact(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="Run id or a unique prefix of it (the run must have ended)."),
    target_mb: float = typer.Option(
        256.0, "--target-mb", min=0.001, help="Merge consecutive steps' parts into parts of about this size."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print what was done as JSON."),
) -> None:
    """Merge an ended run's per-batch rollout parts into a few large ones (queries get faster; the
    records, checksums, replay and audit answer as before)."""
    from reprorl.store.compaction import compact as compact_run

    record = find_run(options(ctx).store(), run)
    done = compact_run(record, target_bytes=max(1, int(target_mb * 2**20)))
    if as_json:
        print_json({"run_id": record.run_id, **done.__dict__})
        return
    console.print(
        f"run {record.run_id}: {done.parts_before} parts ({done.bytes_before / 1e6:,.1f} MB) -> "
        f"{done.parts_after} ({done.bytes_after / 1e6:,.1f} MB), {done.rows:,} rollouts kept"
        + (f"; removed {done.leftovers} files an interrupted compaction left" if done.leftovers else "")
    )
