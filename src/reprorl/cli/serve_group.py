"""`reprorl serve`: long-running servers; each is one command module registered here by one line."""

from __future__ import annotations

import typer

from reprorl.cli import serve_dashboard_cmd, serve_policy_cmd

app = typer.Typer(
    help="Servers: a policy behind an OpenAI-compatible API, the dashboard in a browser.",
    no_args_is_help=True,
)
app.command("policy")(serve_policy_cmd.serve_policy)
app.command("dashboard")(serve_dashboard_cmd.serve_dashboard)
