"""The CLI run in-process with its output captured, for end-to-end tests."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from reprorl.cli.main import main
from reprorl.policy import save_model, tiny_model
from reprorl.store import Store


class Cli:
    def __init__(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.home = home
        self.capsys = capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        code = main(["--home", str(self.home), *args])
        out, err = self.capsys.readouterr()
        return code, out, err

    def ok_json(self, *args: str) -> Any:
        code, out, err = self(*args, "--json")
        assert code == 0, err
        return json.loads(out)

    def error(self, *args: str) -> str:
        code, out, err = self(*args)
        assert code == 2, (out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        return lines[0]


def tiny_training_store(tmp_path: Path) -> Store:
    """A store at `tmp_path/home` with the tiny model (`tiny`) and the calculator train and eval sets."""
    model = tiny_model(0)
    save_model(model.model, model.tokenizer, tmp_path / "tiny")
    store = Store(tmp_path / "home")
    store.add("tiny", tmp_path / "tiny", kind="model")
    for name in ("calc-train", "calc-eval"):
        with resources.as_file(resources.files("reprorl") / "examples" / f"{name}.jsonl") as path:
            store.add(name, path, kind="taskset")
    return store


def tiny_home(tmp_path: Path, name: str) -> Path:
    """Another home under `tmp_path` with the same tiny model (saved once) and calculator task sets."""
    if not (tmp_path / "tiny").exists():
        model = tiny_model(0)
        save_model(model.model, model.tokenizer, tmp_path / "tiny")
    home = tmp_path / name
    store = Store(home)
    store.add("tiny", tmp_path / "tiny", kind="model")
    for taskset in ("calc-train", "calc-eval"):
        with resources.as_file(resources.files("reprorl") / "examples" / f"{taskset}.jsonl") as path:
            store.add(taskset, path, kind="taskset")
    return home


def run_ids(home: Path) -> list[str]:
    """The runs recorded under `home`, oldest first."""
    runs = home / "runs"
    return sorted(p.name for p in runs.iterdir() if not p.name.startswith(".")) if runs.is_dir() else []
