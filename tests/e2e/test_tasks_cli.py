"""`reprorl tasks generate` and `reprorl tasks families`: a family's seeded task sets registered by name,
and every registered family listed with where it came from."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from cli_support import Cli

from reprorl.rollout.families import FAMILIES
from reprorl.store import Store
from reprorl.types import Split, TaskSet


def test_generate_registers_one_task_set_per_split(cli: Cli) -> None:
    counts = {"train": 5, "eval": 4, "holdout": 2}
    flags = [arg for split, n in counts.items() for arg in (f"--{split}", str(n))]
    out = cli.ok_json("tasks", "generate", "calculator", "--seed", "3", *flags)
    assert (out["family"], out["seed"]) == ("calculator", 3)
    rows = out["tasksets"]
    assert [(r["name"], r["split"], r["tasks"], r["version"]) for r in rows] == [
        (f"calculator-{split}", split, n, "v1") for split, n in counts.items()
    ]
    store = Store(cli.home)
    for row in rows:
        version = store.registry.newest(row["name"])
        assert (version.kind, version.hash, version.meta["tasks"]) == ("taskset", row["hash"], row["tasks"])
        tasks = TaskSet.from_jsonl(row["name"], store.read(row["ref"]))
        assert len(tasks.tasks) == row["tasks"]
        assert {t.split for t in tasks.tasks} == {Split(row["split"])}
        assert {t.family for t in tasks.tasks} == {"calculator"}
        assert tasks.version == row["hash"]
    # The same seed gives the same tasks: the same hashes, and no new version.
    again = cli.ok_json("tasks", "generate", "calculator", "--seed", "3", *flags)["tasksets"]
    assert [(r["hash"], r["version"], r["unchanged"]) for r in again] == [
        (r["hash"], "v1", True) for r in rows
    ]
    # Another seed: other tasks, each registered as the next version.
    other = cli.ok_json("tasks", "generate", "calculator", "--seed", "4", *flags)["tasksets"]
    assert all(o["hash"] != r["hash"] and o["version"] == "v2" for o, r in zip(other, rows, strict=True))


def test_generate_passes_only_the_counts_given_and_names_the_prefix(cli: Cli) -> None:
    rows = cli.ok_json("tasks", "generate", "sql", "--eval", "3", "--name", "shop")["tasksets"]
    defaults = FAMILIES["sql"].generate(seed=0)
    assert [(r["name"], r["tasks"]) for r in rows] == [
        ("shop-train", len(defaults[Split.TRAIN].tasks)),
        ("shop-eval", 3),
        ("shop-holdout", len(defaults[Split.HOLDOUT].tasks)),
    ]
    assert rows[0]["hash"] == defaults[Split.TRAIN].version  # the default seed is 0
    # Text output: what was registered, one line each; a split of no tasks is said to be left out.
    code, out, err = cli("tasks", "generate", "files", "--train", "2", "--eval", "1", "--holdout", "0")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith("files-train@v1  2 tasks  sha256:")
    assert lines[1].startswith("files-eval@v1  1 tasks  sha256:")
    assert lines[2] == "files-holdout: no tasks, not registered"
    assert [v.name for v in Store(cli.home).registry.versions("files-holdout")] == []


def test_generate_errors_are_one_line_and_write_nothing(cli: Cli) -> None:
    line = cli.error("tasks", "generate", "nope")
    assert "no env family 'nope'" in line
    assert all(name in line for name in ("calculator", "sql", "files"))
    assert "not a valid artifact name" in cli.error("tasks", "generate", "calculator", "--name", "bad name!")
    assert "--train" in cli.error("tasks", "generate", "calculator", "--train", "-1")
    assert cli.ok_json("artifacts", "list") == []


def test_families_lists_every_family_with_where_it_came_from(cli: Cli) -> None:
    rows = {row["name"]: row for row in cli.ok_json("tasks", "families")}
    assert {"calculator", "sql", "files"} <= set(rows)
    for name in ("calculator", "sql", "files"):
        row = rows[name]
        assert row["origin"]["module"] == f"reprorl.envs.families.{name}"
        assert row["origin"]["distribution"] is None and row["origin"]["entry_point"] is None
        assert row["env"].startswith(f"reprorl.envs.families.{name}:")
        assert row["tool_modules"] == list(FAMILIES[name].tool_modules)
        assert "ask_human" in row["tools"]
    assert rows["calculator"]["tools"] == ["calc", "ask_human"]
    assert rows["calculator"]["cross_verifiers"] == ["ExpressionAnswer"]
    code, out, err = cli("tasks", "families")
    assert code == 0, err
    for name in ("calculator", "sql", "files"):
        assert name in out and f"reprorl.envs.families.{name}" in out
    assert "built in" in out


DOC = Path(__file__).resolve().parents[2] / "docs" / "envs.md"
RUN = (
    "import json, sys; import todo_family; from reprorl.cli.main import main; "
    "sys.exit(main(json.loads(sys.argv[1])))"
)


def test_the_docs_family_generates_its_three_task_sets(tmp_path: Path) -> None:
    """docs/envs.md's todo family (`generate(seed, **counts)`), registered in a process of its own."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    (tmp_path / "todo_family.py").write_text(next(b for b in blocks if "class TodoEnv" in b))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}

    def cli(*args: str) -> Any:
        argv = json.dumps(["--home", str(tmp_path / "home"), *args, "--json"])
        done = subprocess.run(
            [sys.executable, "-c", RUN, argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    rows = cli("tasks", "generate", "todo", "--seed", "0")["tasksets"]
    assert [(r["name"], r["tasks"]) for r in rows] == [
        ("todo-train", 8),
        ("todo-eval", 8),
        ("todo-holdout", 4),
    ]
    assert [r["tasks"] for r in cli("tasks", "generate", "todo", "--holdout", "2")["tasksets"]] == [8, 8, 2]
    (todo,) = [row for row in cli("tasks", "families") if row["name"] == "todo"]
    assert todo["origin"]["module"] == "todo_family" and todo["tools"] == ["add_todo"]
