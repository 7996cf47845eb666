"""docs/envs.md's and docs/training.md's walkthrough, run as written: a package of its own, holding a
family of at most 60 lines and a loss in one file, is pip-installed into this venv, found by its
entry points, and trained with `reprorl run` — the family and the loss selected by name, no file of
reprorl touched, no `.pth` file, no launcher script."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import Cli, run_ids, tiny_spec, tiny_training_store
from safetensors.torch import load_file

from reprorl.config.load import stored_spec
from reprorl.config.loss import LOSSES
from reprorl.orchestrate.run.effective import EFFECTIVE_FILE, disagreements
from reprorl.rollout.families import FAMILIES
from reprorl.store import RunRecord
from reprorl.store.rollout_query import RolloutStore

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parents[2] / "docs"
PACKAGE = "todo-family"

# Warm-started far enough that some of its calls are well-formed: its groups' rewards vary.
SPEC = tiny_spec(
    "todo-plugin", seed=5, learning={"sft_steps": 12, "sft_lr": 3e-3, "group_size": 4, "max_tokens": 120}
)


def block(doc: str, language: str, marker: str) -> str:
    """The one fenced block of `language` in docs/`doc` that contains `marker`."""
    blocks = re.findall(rf"```{language}\n(.*?)```", (DOCS / doc).read_text(encoding="utf-8"), flags=re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"docs/{doc} has {len(found)} {language} blocks with {marker!r}"
    return found[0]


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[Path]:
    """The walkthrough's package, written from the docs' blocks; uninstalled and forgotten after."""
    package = tmp_path / PACKAGE
    package.mkdir()
    family = block("envs.md", "python", "class TodoEnv")
    assert len(family.strip().splitlines()) <= 60
    (package / "todo_family.py").write_text(family)
    (package / "sequence_pg.py").write_text(
        block("training.md", "python", "@register_loss(SequencePGConfig)")
    )
    (package / "pyproject.toml").write_text(block("envs.md", "toml", "[project.entry-points"))
    yield package
    subprocess.run(
        [sys.executable, "-m", "pip", "uninstall", "--yes", "--quiet", PACKAGE],
        capture_output=True,
        timeout=300,
        check=False,
    )
    for name in ("todo_family", "sequence_pg"):
        sys.modules.pop(name, None)
    FAMILIES.remove("todo")
    LOSSES.remove("sequence_pg")


def _shell(tmp_path: Path, cli: Cli, spec: Path) -> list[tuple[int, str, str]]:
    """Each line of the walkthrough's shell block: `pip install` into this venv, `reprorl` in-process."""
    done = []
    for line in block("envs.md", "sh", "pip install").strip().splitlines():
        words = shlex.split(line, comments=True)
        if words[:2] == ["pip", "install"]:
            pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index"]
            result = subprocess.run(
                [*pip, "--quiet", *words[2:]], cwd=tmp_path, capture_output=True, text=True, timeout=600
            )
            assert result.returncode == 0, result.stderr
            continue
        assert words[0] == "reprorl", line
        done.append(cli(*[str(spec) if w == "spec.toml" else w for w in words[1:]]))
    return done


def test_a_family_and_a_loss_of_an_installed_package_train_by_name(
    tmp_path: Path, installed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tiny_training_store(tmp_path)
    home = tmp_path / "home"
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    cli = Cli(home, capsys)
    results = _shell(tmp_path, cli, spec)
    assert [code for code, _, _ in results] == [0] * len(results), [err for _, _, err in results]

    listed = {f["name"]: f for f in cli.ok_json("tasks", "families")}
    assert {"calculator", "sql", "files", "todo"} <= set(listed)
    assert PACKAGE in json.dumps(listed["todo"]) and "todo_family" in json.dumps(listed["todo"])

    (run_id,) = run_ids(home)
    record = RunRecord(store, run_id)
    assert record.status()["status"] == "succeeded", record.status()
    trained = list(RolloutStore(record).trajectories("split = 'train'"))
    assert trained and {t.task_id.split("-")[0] for t in trained} == {"todo"}
    assert all(t.env_version for t in trained)
    fields: dict[str, Any] = json.loads((record.path / EFFECTIVE_FILE).read_text())["fields"]
    assert fields["learning.loss.kind"] == "sequence_pg" and fields["learning.loss.advantage_clip"] == 5.0
    assert disagreements(stored_spec(record.spec()), fields) == []
    steps = [m for m in record.metrics().records if m.get("stage") is None]
    assert len(steps) == 2 and all("train/pg_loss" in m for m in steps)
    assert any(m["train/grad_norm"] > 0 for m in steps), "the plug-in loss passed no gradient"
    adapter = load_file(str(next((record.path / "adapter").glob("*.safetensors"))))
    assert any(float(t.abs().sum()) > 0 for n, t in adapter.items() if "lora_B" in n)  # it trained


def test_the_docs_episode_by_hand_runs_the_installed_family(installed: Path, tmp_path: Path) -> None:
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*pip, "--quiet", str(installed)], capture_output=True, timeout=600, check=True)
    code = block("envs.md", "python", 'SandboxPool(["todo_family"])')
    body = "".join(f"    {line}\n" for line in code.splitlines())
    namespace: dict[str, Any] = {}
    exec(f"async def _episode():\n{body}    return trajectory\n", namespace)  # the block as written
    trajectory = asyncio.run(namespace["_episode"]())
    assert trajectory.reward is not None and trajectory.reward.components["outcome"] == 1.0
