"""`reprorl rewards judge`: an LLM judge scores a stored run's rollouts into its `judge_scores.jsonl`."""

from __future__ import annotations

from pathlib import Path

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.config.load import load_judge_config
from reprorl.store import find_run


def judge(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="Run id or a unique prefix of it."),
    judge_file: Path = typer.Option(
        ..., "--judge", metavar="FILE.toml", help="The judge: a TOML file of JudgeConfig fields."
    ),
    where: str | None = typer.Option(
        None,
        "--where",
        help="SQL condition on the rollout columns, e.g. \"split='eval'\" (default: every rollout).",
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Judge at most this many rollouts."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Score the run's rollouts with an LLM judge, kept apart from their rewards.

    Compare the judge with human labels afterwards with `reprorl rewards errors RUN`.
    """
    from reprorl.orchestrate.jobs.judge_run import judge_run
    from reprorl.orchestrate.run.rollouts import progress_bar

    config = load_judge_config(judge_file)
    store = options(ctx).store()
    record = find_run(store, run)
    with progress_bar("judging", not as_json) as progress:
        bar = progress.add_task("rollouts", total=None)
        result = judge_run(
            store,
            record,
            config,
            where=where,
            limit=limit,
            on_progress=lambda done, total: progress.update(bar, completed=done, total=total),
        )
    if as_json:
        print_json(result.to_json())
        return
    mean = "-" if result.mean_score is None else f"{result.mean_score:.3f}"
    console.print(
        f"judge {result.judge} on run {result.run_id}: {result.judged} of {result.selected} rollouts scored, "
        f"{result.passed} passed (score >= 0.5), mean score {mean}",
        markup=False,
    )
    if result.failures:
        shown = ", ".join(f"{n} {kind}" for kind, n in sorted(result.failures.items()))
        console.print(f"failed judgements (kept, with their class): {shown}", markup=False)
    if result.no_task:
        console.print(
            f"{result.no_task} rollouts not judged: their task is gone from the store or changed since",
            markup=False,
        )
    console.print(
        f"{result.requests} requests, {result.cache_hits} answered from the cache, ${result.cost_usd:.4f}",
        markup=False,
    )
    if result.audit is None:
        console.print("this judge has no robustness audit (reprorl rewards audit --judge FILE)", markup=False)
    elif result.audit_refused:
        console.print(f"note: this judge was refused by its robustness audit {result.audit}", markup=False)
    if result.path is not None:
        console.print(f"scores: {result.path}; against human labels: reprorl rewards errors {result.run_id}")
