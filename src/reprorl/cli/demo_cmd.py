"""`reprorl demo`: the main job on the embedded defaults — register, warm start, train, evaluate, report."""

from __future__ import annotations

import asyncio
from importlib import resources

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console
from reprorl.config import load_spec, resolve_spec
from reprorl.orchestrate import create_run
from reprorl.store import Store

BASE_MODEL_NAME = "smollm2-135m-instruct"
# Shipped task sets (train and eval split of each built-in family), registered under these names.
TASK_SETS = ("calc-train", "calc-eval", "sql-train", "sql-eval", "files-train", "files-eval")


def register_defaults(store: Store) -> None:
    """The bundled model and every shipped task set; re-registering unchanged content is a no-op."""
    from reprorl.policy.gguf import bundled_gguf

    examples = resources.files("reprorl") / "examples"
    with resources.as_file(examples) as folder:
        steps = [(BASE_MODEL_NAME, bundled_gguf(), "model")]
        steps += [(name, folder / f"{name}.jsonl", "taskset") for name in TASK_SETS]
        for name, path, kind in steps:
            version = store.add(name, path, kind=kind)
            console.print(f"registered {version.label:<28} {version.hash}")


def demo(
    ctx: typer.Context,
    overrides: list[str] | None = typer.Argument(None, help="Dotted overrides, e.g. learning.steps=2."),
    record_only: bool = typer.Option(
        False, "--record-only", help="Register and record the run, but do not train it."
    ),
) -> None:
    """Register the bundled model and task sets, then warm-start and train the demo spec and report."""
    from reprorl.orchestrate.jobs.train import train_run
    from reprorl.orchestrate.run.outcome import eval_outcomes

    store = options(ctx).store()
    register_defaults(store)
    with resources.as_file(resources.files("reprorl") / "configs" / "demo.toml") as spec_file:
        spec = load_spec(spec_file, overrides or [], pin_bare=store.pin_newest)
    resolved = resolve_spec(spec, store.pin)
    if record_only:
        record = create_run(resolved, store)
        console.print(f"run {record.run_id} recorded (not trained): spec {resolved.spec_hash()}")
        console.print(f"  see it with: reprorl runs show {record.run_id}")
        return
    learning = resolved.learning
    console.print(
        f"training {resolved.name}: {learning.sft_steps} SFT steps, then {learning.steps} RL steps of "
        f"{learning.tasks_per_step} tasks x {learning.group_size} rollouts (about 15 minutes on 2 cores)"
    )
    record = asyncio.run(train_run(store, resolved, show_progress=True))
    for outcome in eval_outcomes(record, seed=resolved.seed):
        console.print(f"held-out success on {outcome.suite} (95% CI over tasks):")
        console.print(f"  before RL (step {outcome.first_step}): {outcome.before}")
        console.print(f"  after RL  (step {outcome.last_step}): {outcome.after}")
        console.print(f"  change, paired by task: {outcome.change}")
    # The demo's warm start is cut to fit its time: more SFT alone would lift it too (docs/training.md).
    console.print(
        "this warm start is short, so part of the change is what more SFT would also give; the recipes "
        "measured against an equal-compute SFT control are configs/calculator.toml, configs/sql.toml and "
        "configs/files.toml in the repository (docs/training.md, 'Recipes'; bench/learning.py)"
    )
    console.print(f"run record: {record.path}")
    console.print(f"  see it with: reprorl runs show {record.run_id}")
