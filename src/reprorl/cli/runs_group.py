"""`reprorl runs`: recorded runs, and everything read back from their records."""

from __future__ import annotations

import typer

from reprorl.cli import (
    audit_cmd,
    bundle_cmd,
    compare_cmd,
    diff_cmd,
    export_cmd,
    report_cmd,
    rollouts_cmd,
    runs_cmd,
)

app = typer.Typer(help="Recorded runs: list, inspect, compare, audit and report them.", no_args_is_help=True)
app.command("list")(runs_cmd.list_)
app.command("show")(runs_cmd.show)
app.command("rollouts")(rollouts_cmd.rollouts)
app.command("compact")(rollouts_cmd.compact)
app.command("diff")(diff_cmd.diff)
app.command("compare")(compare_cmd.compare)
app.command("audit")(audit_cmd.audit)
app.command("report")(report_cmd.report)
app.command("export-metrics")(export_cmd.export_metrics)
app.command("export-adapter")(export_cmd.export_adapter_cmd)
app.command("export")(bundle_cmd.export)
app.command("import")(bundle_cmd.import_)
app.command("verify")(bundle_cmd.verify)
app.command("keygen")(bundle_cmd.keygen)
