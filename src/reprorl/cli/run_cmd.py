"""`reprorl run`: train a run spec end to end and record everything; `--resume` continues a killed run."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console
from reprorl.config import RunSpec, load_spec, resolve_spec
from reprorl.config.load import stored_spec
from reprorl.errors import UserInputError
from reprorl.sinks import SinkObserver, SinkTarget, parse_targets
from reprorl.store import RunRecord, Store


def run(
    ctx: typer.Context,
    file: Path | None = typer.Argument(None, help="Run spec (TOML).", dir_okay=False),
    overrides: list[str] | None = typer.Argument(None, help="Dotted overrides, e.g. learning.steps=5."),
    resume: str | None = typer.Option(
        None, "--resume", metavar="RUN", help="Continue this run from its newest checkpoint."
    ),
    ray: str | None = typer.Option(
        None,
        "--ray",
        metavar="ADDRESS",
        help="Run the trainer and the rollout workers (learning.pipeline.workers of them) as Ray "
        "actors: 'local' starts a cluster on this machine, 'auto' or an address joins an existing one.",
    ),
    trainer_gpus: float = typer.Option(
        0.0, "--trainer-gpus", min=0.0, help="GPUs the Ray trainer actor asks the cluster for (with --ray)."
    ),
    sink: list[str] | None = typer.Option(
        None,
        "--sink",
        metavar="KIND:DIR",
        help="Also mirror metrics live to tensorboard:DIR, mlflow:DIR or wandb:DIR (repeatable; "
        "not part of the spec).",
    ),
) -> None:
    """SFT warm start (if the spec asks), then policy-gradient steps; records, metrics, adapter."""
    targets = parse_targets(sink, option="--sink")
    store = options(ctx).store()
    if resume is not None:
        if file is not None or overrides:
            raise UserInputError(
                "--resume takes the spec from the run's record; drop the spec file and overrides"
            )
        record = RunRecord(store, resume)
        status = record.status()["status"]
        if status == "succeeded":
            raise UserInputError(
                f"run {resume} already finished (status succeeded); there is nothing to resume"
            )
        spec = stored_spec(record.spec())
        from reprorl.orchestrate.jobs.train import train_run  # torch and the models load from here

        console.print(f"resuming run {resume} (was {status})")
        if ray is not None:
            record = on_ray(store, spec, record, ray, trainer_gpus, targets, resume=True)
        else:
            with mirrored(targets, resume):
                record = asyncio.run(train_run(store, spec, resume=record, show_progress=True))
    else:
        if file is None:
            raise UserInputError("give a run spec file, or --resume RUN", field="FILE")
        spec = resolve_spec(load_spec(file, overrides or [], pin_bare=store.pin_newest), store.pin)
        # A spec the gates refuse is refused here, before torch and the models load.
        from reprorl.orchestrate.run.preflight import check_family_weights, check_run_leakage

        check_run_leakage(store, spec)
        check_family_weights(store, spec)
        from reprorl.orchestrate.jobs.train import prepare_run, train_run

        if ray is not None:
            record = on_ray(store, spec, prepare_run(store, spec), ray, trainer_gpus, targets, resume=False)
        else:
            with mirrored(targets, None):
                record = asyncio.run(train_run(store, spec, show_progress=True))
    status = record.status()
    if status["status"] == "stopped":
        console.print(f"run {record.run_id} stopped: {status.get('reason', 'a rollback rule fired')}")
    else:
        console.print(f"run {record.run_id} finished")
    console.print(f"see it with: reprorl runs show {record.run_id}")


def on_ray(
    store: Store,
    spec: RunSpec,
    record: RunRecord,
    address: str,
    gpus: float,
    targets: list[SinkTarget],
    *,
    resume: bool,
) -> RunRecord:
    """Train `record` in a Ray trainer actor, following it here; warn about any sink that failed."""
    from reprorl.orchestrate.jobs.ray_trainer import train_on_ray

    record, failures = asyncio.run(
        train_on_ray(
            store, spec, record, address=address, resume=resume, gpus=gpus, sinks=targets, show_progress=True
        )
    )
    for label, reason in failures:
        console.print(f"[yellow]warning:[/] sink {label} was disabled: {reason}")
    return record


@contextlib.contextmanager
def mirrored(targets: list[SinkTarget], run_id: str | None) -> Iterator[None]:
    """Mirror the run's lines into `targets` while the block trains it; warn about any sink that failed."""
    if not targets:
        yield
        return
    observer = SinkObserver(targets, run_id=run_id)
    with RunRecord.observing(observer):
        try:
            yield
        finally:
            for label, reason in observer.close():
                console.print(f"[yellow]warning:[/] sink {label} was disabled: {reason}")
