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


TINY_SECTIONS: dict[str, dict[str, Any]] = {
    "model": {
        "owner": "t@x",
        "base": "tiny",
        "adapter": {"kind": "lora", "rank": 4, "alpha": 8.0, "targets": ["q_proj", "v_proj"]},
    },
    # The tiny model never answers right; a component that varies gives its groups a signal.
    "data": {"owner": "t@x", "train": "calc-train", "reward_weights": {"outcome": 1.0, "valid_calls": 1.0}},
    "learning": {
        "owner": "t@x",
        "steps": 2,
        "lr": 1e-3,
        "group_size": 2,
        "tasks_per_step": 2,
        "max_tokens": 12,
        "max_turns": 2,
        "drop_zero_variance_groups": False,
    },
    "evaluation": {"owner": "t@x", "suites": ["calc-eval"], "every_steps": 10},
}


def toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def tiny_spec(name: str, seed: int = 0, **changes: dict[str, Any]) -> str:
    """A run spec for the tiny model on the calculator sets (`tiny_training_store`), as TOML; each
    keyword is a section whose fields replace or add to the defaults (`learning={"steps": 4}`)."""
    lines = [f"name = {json.dumps(name)}", f"seed = {seed}"]
    for section, fields in TINY_SECTIONS.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in {**fields, **changes.get(section, {})}.items()]
    return "\n".join(lines) + "\n"


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
