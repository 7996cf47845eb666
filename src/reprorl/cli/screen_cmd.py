"""`reprorl tasks screen`: a task set's teachable tasks for a policy, and the ones whose reward is suspect."""

from __future__ import annotations

import asyncio

import typer
from rich.table import Table

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.config.screen import ScreenSpec
from reprorl.errors import UserInputError
from reprorl.evaluation.screening import CLASSES, ScreenReport
from reprorl.hardware import resolve_dtype
from reprorl.store import RunRecord, find_run
from reprorl.types import Split

BAR = 40  # characters of the widest histogram bar


def screen(
    ctx: typer.Context,
    taskset: str | None = typer.Argument(None, help="The task set to screen (name, name@vN or hash)."),
    policy: str | None = typer.Option(
        None,
        "--policy",
        metavar="MODEL[+ADAPTER]",
        help="The policy: a base model, '+' an adapter; or 'oracle'.",
    ),
    k: int = typer.Option(8, "-k", min=1, help="Attempts per task."),
    split: Split | None = typer.Option(None, "--split", help="Screen only this split (default: every task)."),
    seed: int = typer.Option(0, "--seed", help="Root seed of every attempt."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="Max new tokens per model turn."),
    max_turns: int = typer.Option(3, "--max-turns", min=1),
    dtype: str = typer.Option(
        "float32", "--dtype", help="Sampling precision: float32, bfloat16, or auto (this machine's faster)."
    ),
    chunk: int = typer.Option(
        8, "--chunk", min=1, help="Tasks per recorded part (what a kill loses at most)."
    ),
    replays: int = typer.Option(1, "--replays", min=0, help="Replays of one answered attempt per task."),
    probes: bool = typer.Option(True, "--probes/--no-probes", help="Run the exploit probes on every task."),
    concurrency: int = typer.Option(16, "--concurrency", min=1, help="Episodes at once."),
    name: str | None = typer.Option(
        None, "--name", help="Register the trainable subset under this name (default: the task set's own)."
    ),
    resume: str | None = typer.Option(None, "--resume", metavar="RUN", help="Continue a killed screen."),
    ray: str | None = typer.Option(
        None,
        "--ray",
        metavar="ADDRESS",
        help="Screen chunks on Ray actors: 'local' starts a cluster here, 'auto' or an address joins one.",
    ),
    workers: int = typer.Option(2, "--workers", min=1, help="Ray screen workers (with --ray)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run the policy k times per task and classify each: trainable, too_easy, no_signal, flaky, suspect.

    The trainable subset is registered as a new version of the task set, with its lineage.
    """
    from reprorl.orchestrate.jobs.screen import parse_policy
    from reprorl.orchestrate.jobs.screen import screen as run_screen

    store = options(ctx).store()
    record: RunRecord | None = None
    spec: ScreenSpec | None = None
    if resume is not None:
        if taskset is not None or policy is not None:
            raise UserInputError(
                "--resume takes the settings from the screen's record; drop TASKSET and --policy"
            )
        record = find_run(store, resume)
        if "screen" not in record.spec():
            raise UserInputError(
                f"run {record.run_id} is not a screen; resume runs with reprorl run --resume"
            )
    else:
        if taskset is None or policy is None:
            raise UserInputError(
                "give a task set and --policy MODEL[+ADAPTER] (or --resume RUN)", field="--policy"
            )
        if dtype not in ("auto", "float32", "bfloat16"):
            raise UserInputError(f"--dtype {dtype!r}: use auto, float32 or bfloat16", field="--dtype")
        spec = ScreenSpec(
            taskset=store.pin_newest(taskset),
            split=split,
            policy=parse_policy(store, policy),
            k=k,
            seed=seed,
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            max_turns=max_turns,
            sampling_dtype=resolve_dtype(dtype),  # pinned: the screen's record says what ran
            chunk=chunk,
            replays=replays,
            probes=probes,
            concurrency=concurrency,
        )
    record, report = asyncio.run(
        run_screen(
            store, spec, resume=record, register_as=name, show_progress=not as_json, ray=ray, workers=workers
        )
    )
    if as_json:
        print_json(report.to_json())
        return
    show(report)
    console.print(f"screen {record.run_id}; see its episodes with: reprorl runs rollouts {record.run_id}")


def show(report: ScreenReport) -> None:
    """The screen's report as tables and a histogram."""
    counts = report.counts()
    table = Table(title=f"{len(report.tasks)} tasks, k = {report.k}")
    table.add_column("family")
    for verdict in CLASSES:
        table.add_column(verdict, justify="right")
    for family, row in report.per_family().items():
        table.add_row(family, *(str(row[c]) for c in CLASSES))
    table.add_row("all", *(str(counts[c]) for c in CLASSES), style="bold")
    console.print(table)
    histogram = report.histogram()
    widest = max((n for _, n in histogram), default=0) or 1
    console.print("pass rate (passes out of k: tasks)")
    for passes, n in histogram:
        console.print(f"  {passes:>3}/{report.k}  {'#' * round(BAR * n / widest):<{BAR}} {n}")
    trainable = report.trainable()
    if trainable:
        console.print("trainable, most signal first (p(1-p)):")
        for t in trainable[:10]:
            console.print(f"  {t.task_id}  p = {t.p:.2f}  signal = {t.signal:.3f}")
        if len(trainable) > 10:
            console.print(f"  … and {len(trainable) - 10} more")
    for t in report.by_class("suspect"):
        console.print(f"[red]suspect[/] {t.task_id}: reward earned by probe(s) {', '.join(t.probe_hits)}")
    for t in report.by_class("flaky"):
        console.print(f"[yellow]flaky[/] {t.task_id}: replayed outcomes {list(t.replay_outcomes)}")
    if report.new_version:
        console.print(f"registered the {len(trainable)} trainable tasks as {report.new_version}")
    else:
        console.print("no trainable task: nothing registered")
