"""`reprorl tasks`: task sets — generate them from a family, merge, screen them, grow regression suites."""

from __future__ import annotations

import typer

from reprorl.cli import families_cmd, generate_cmd, merge_cmd, regression_cmd, screen_cmd

app = typer.Typer(
    help="Task sets and env families: generate, list families, merge, screen, grow regression suites.",
    no_args_is_help=True,
)
app.command("generate")(generate_cmd.generate)
app.command("families")(families_cmd.families)
app.command("screen")(screen_cmd.screen)
app.command("regression")(regression_cmd.regression)
app.command("merge")(merge_cmd.merge)
