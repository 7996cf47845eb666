"""`reprorl runs diff`: every condition that differs between two runs, and how their eval metrics moved."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.store import find_run

if TYPE_CHECKING:
    from reprorl.audit.diff import Condition
    from reprorl.audit.suite_deltas import SuiteDelta, SuiteSide

# Figures worth a glance next to success; the rest are in --json.
HEADLINE = ("reward", "tool_calls_mean", "invalid_calls_mean", "completion_tokens_mean", "cost_usd")


def diff(
    ctx: typer.Context,
    run_a: str = typer.Argument(..., help="Run A (id or unique prefix)."),
    run_b: str = typer.Argument(..., help="Run B, compared with A."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List every condition that differs between RUN_A and RUN_B, and the metric deltas (B - A)."""
    from reprorl.audit.diff import diff_runs

    store = options(ctx).store()
    result = diff_runs(store, find_run(store, run_a), find_run(store, run_b))
    if as_json:
        print_json(result.to_json())
        return
    console.print(f"A = {result.run_a}\nB = {result.run_b}")
    if not result.comparable:
        console.print(
            "[bold white on red] NOT COMPARABLE [/] [bold red]the metrics of these runs cannot be compared: "
            + escape("; ".join(result.reasons))
            + "[/]"
        )
    if result.conditions:
        console.print(_table(f"{len(result.conditions)} condition(s) differ", result.conditions))
    else:
        console.print("no condition differs")
    for condition in result.conditions:
        for line in condition.detail:
            console.print(f"  [dim]{escape(line)}[/]")
    if result.derived:
        console.print(_table("derived: differ because of the conditions above", result.derived))
    if result.labels:
        names = ", ".join(c.field for c in result.labels)
        console.print(f"[dim]labels differ (not conditions): {escape(names)}[/]")
    for suite in result.metrics:
        _print_suite(suite)


def _table(title: str, conditions: Iterable[Condition]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("group", "field", "A", "B", "note"):
        table.add_column(column, overflow="fold")
    for c in conditions:
        table.add_row(c.group, c.field, _show(c.a), _show(c.b), c.note)
    return table


def _show(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, list):
        return ", ".join(_show(v) for v in value) or "[]"
    text = str(value)
    if text.startswith("sha256:") and len(text) == 71:
        return text[:19]  # a full hash: its first 12 hex digits name it well enough on screen
    return escape(text)


def _print_suite(suite: SuiteDelta) -> None:
    sides = [("A", suite.a), ("B", suite.b)]
    console.print(f"\n[bold]suite {escape(suite.suite)}[/] (last eval point)")
    for tag, side in sides:
        if side is None:
            console.print(f"  {tag}: not evaluated on it")
            continue
        console.print(
            f"  {tag}: {escape(side.version)} step {side.step}, {side.tasks} tasks "
            f"({'+'.join(side.splits) or 'no rollouts'}): success {_ci(side, 'success')}"
        )
    if not suite.comparable:
        console.print(f"  [bold red]NOT COMPARABLE: {escape(str(suite.reason))}[/]")
        return
    d = suite.difference
    if d is not None:
        e = d.estimate
        console.print(
            f"  B - A success: {e.value:+.3f} [{e.low:+.2f}, {e.high:+.2f}]  p = {d.p_value:.3g}  "
            f"(paired over {e.n} tasks)"
        )
    deltas = suite.deltas()
    shown = [f"{name} {deltas[name]:+.3g}" for name in HEADLINE if name in deltas]
    if shown:
        console.print("  B - A: " + ", ".join(shown))


def _ci(side: SuiteSide, name: str) -> str:
    value, low, high = (side.figure(n) for n in (name, f"{name}_low", f"{name}_high"))
    if math.isnan(value):
        return "—"
    return f"{value:.3f}" + ("" if math.isnan(low) else f" [{low:.2f}, {high:.2f}]")
