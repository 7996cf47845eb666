"""`reprorl runs audit`: the reproducibility checklist for one run, answered from its records.

Exit codes: 0 when every question passes, 1 when any fails (the table or JSON is printed either way),
2 for an error such as an unknown run.
"""

from __future__ import annotations

import typer
from rich.table import Table
from rich.text import Text

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.store import find_run

EXIT_FAILED = 1


def audit(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="The run (id or unique prefix)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Answer the ten questions to ask before scaling RUN: PASS with the record that proves it, or FAIL."""
    from reprorl.audit.audit import audit_run

    store = options(ctx).store()
    report = audit_run(store, find_run(store, run).run_id)
    if as_json:
        print_json(report.to_json())
    else:
        table = Table(title=f"audit of run {report.run_id}", show_lines=True)
        table.add_column("#", justify="right")
        table.add_column("question")
        table.add_column("answer")
        table.add_column("evidence / what is missing")
        for answer in report.answers:
            lines = Text()
            for text, style in (
                *((f"- {m}", "red") for m in answer.missing),
                *((f"+ {e}", "") for e in answer.evidence),
                *((f"~ {n}", "dim") for n in answer.notes),
            ):
                lines.append(("\n" if lines else "") + text, style=style)
            verdict = Text(answer.status, style="bold green" if answer.passed else "bold red")
            table.add_row(str(answer.number), answer.question, verdict, lines)
        console.print(table)
        console.print(report.summary())
    if not report.passed:
        raise typer.Exit(EXIT_FAILED)
