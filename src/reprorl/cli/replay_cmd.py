"""`reprorl replay`: re-execute one rollout from its record and report the first difference."""

from __future__ import annotations

from typing import Literal, cast

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json


def replay(
    ctx: typer.Context,
    rollout_id: str = typer.Argument(..., help="Rollout id, e.g. '<run_id>/train/0/<task_id>/3'."),
    mode: str = typer.Option(
        "live",
        "--mode",
        help="'recorded': tool results from the record (checks the model); "
        "'live': tools and verifier run again (checks the env too).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Replay a rollout bit for bit; exit 1 when anything differs."""
    from reprorl.errors import UserInputError
    from reprorl.orchestrate.replay import replay as run_replay

    if mode not in ("recorded", "live"):
        raise UserInputError(f"--mode: {mode!r} is not 'recorded' or 'live'")
    import asyncio

    report = asyncio.run(
        run_replay(options(ctx).store(), rollout_id, mode=cast(Literal["recorded", "live"], mode))
    )
    if as_json:
        print_json(report.to_json())
    elif report.identical:
        console.print(
            f"identical: {report.turns} turn(s), {report.tokens} tokens and their logprobs"
            + (", tool results, reward and termination" if mode == "live" else "")
            + f" match the record ({mode} replay)"
        )
    else:
        first = report.first
        assert first is not None
        where = f" at turn {first.turn}" if first.turn is not None else ""
        at = f", position {first.index}" if first.index is not None else ""
        console.print(
            f"differs: first difference is the {first.where}{where}{at}: "
            f"recorded {first.recorded!r}, replayed {first.replayed!r}"
        )
    if not report.identical:
        raise typer.Exit(1)
