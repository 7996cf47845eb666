"""`reprorl replay`: re-execute rollouts from their records and report the first difference of each."""

from __future__ import annotations

import asyncio
import random
from typing import Any, Literal, cast

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.errors import UserInputError


def replay(
    ctx: typer.Context,
    rollout_ids: list[str] | None = typer.Argument(
        None, help="Rollout ids, e.g. '<run_id>/train/0/<task_id>/3'."
    ),
    run: str | None = typer.Option(None, "--run", help="With --random: the run to draw rollouts from."),
    sample: int = typer.Option(
        0, "--random", min=0, help="Replay this many rollouts of --run, drawn at random."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the --random draw."),
    mode: str = typer.Option(
        "live",
        "--mode",
        help="'recorded': tool results from the record (checks the model); "
        "'live': tools and verifier run again (checks the env too).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the reports as JSON."),
) -> None:
    """Replay rollouts bit for bit; exit 1 when anything differs."""
    from reprorl.orchestrate.jobs.replay import Replayer

    if mode not in ("recorded", "live"):
        raise UserInputError(f"--mode: {mode!r} is not 'recorded' or 'live'")
    store = options(ctx).store()
    ids = list(rollout_ids or [])
    if sample:
        if run is None:
            raise UserInputError("--random needs --run RUN to draw from")
        ids += _draw(store, run, sample, seed)
    if not ids:
        raise UserInputError("name rollout ids, or use --run RUN --random N")
    replayer = Replayer(store)

    async def replay_all() -> list[Any]:
        return [await replayer.replay(i, mode=cast(Literal["recorded", "live"], mode)) for i in ids]

    try:
        reports = asyncio.run(replay_all())
    finally:
        replayer.close()
    if as_json:
        print_json(
            reports[0].to_json() if len(reports) == 1 and not sample else [r.to_json() for r in reports]
        )
    else:
        for report in reports:
            console.print(_line(report, mode))
        if len(reports) > 1:
            same = sum(r.identical for r in reports)
            compared, agreed = sum(r.compared for r in reports), sum(r.agreed for r in reports)
            console.print(
                f"{same}/{len(reports)} identical ({mode} replay, {replayer.batches_sampled} batches re-run)"
                + (f"; {_agreement(agreed, compared)}" if mode == "live" and compared else "")
            )
    if not all(r.identical for r in reports):
        raise typer.Exit(1)


def _draw(store: Any, run: str, count: int, seed: int) -> list[str]:
    from reprorl.store import find_run
    from reprorl.store.rollout_query import RolloutStore

    rows = RolloutStore(find_run(store, run)).query("NOT retried", columns=["rollout_id"]).to_pylist()
    ids = sorted(str(r["rollout_id"]) for r in rows)
    return random.Random(seed).sample(ids, min(count, len(ids)))


def _agreement(agreed: int, compared: int) -> str:
    return f"token agreement {agreed}/{compared} ({agreed / compared:.1%})"


def _line(report: Any, mode: str) -> str:
    rate = f"; {_agreement(report.agreed, report.compared)}" if mode == "live" and report.compared else ""
    if report.identical:
        checked = ", tool results, reward and termination" if mode == "live" else ""
        return (
            f"identical: {report.rollout_id}: {report.turns} turn(s), {report.tokens} tokens and their "
            f"logprobs{checked} match the record ({mode} replay){rate}"
        )
    first = report.first
    where = f" at turn {first.turn}" if first.turn is not None else ""
    at = f", position {first.index}" if first.index is not None else ""
    return (
        f"differs: {report.rollout_id}: first difference is the {first.where}{where}{at}: "
        f"recorded {first.recorded!r}, replayed {first.replayed!r}{rate}"
    )
