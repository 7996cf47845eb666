"""A mixed-family run from the CLI: `tasks merge` registers the union with its lineage, every step draws
each family its weighted share, the figures and eval points are per family, the exploration watch
logs the oracle's needed tools, and an SFT-only run (`learning.steps = 0`) is measured at step 0."""

from __future__ import annotations

from collections import Counter
from importlib import resources
from pathlib import Path

import pytest
from cli_support import Cli, run_ids, tiny_home, tiny_spec

from reprorl.orchestrate.run.exploration import ORACLE_EVENT
from reprorl.report.render import build_report
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore

pytestmark = pytest.mark.slow


def _home(tmp_path: Path) -> Path:
    home = tiny_home(tmp_path, "home")
    store = Store(home)
    for name in ("sql-train", "sql-eval", "files-train", "files-eval"):
        with resources.as_file(resources.files("reprorl") / "examples" / f"{name}.jsonl") as path:
            store.add(name, path, kind="taskset")
    return home


def test_a_mixed_family_run_trains_every_family_every_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = _home(tmp_path)
    cli = Cli(home, capsys)
    merged = cli.ok_json("tasks", "merge", "mixed-train", "calc-train", "sql-train", "files-train")
    assert (
        merged["families"] == {"calculator": 64, "sql": 64, "files": 64} and len(merged["merged_from"]) == 3
    )
    store = Store(home)
    parents = {parent for parent, _, _ in store.registry.parents(merged["hash"])}
    assert parents == {
        store.resolve(store.pin_newest(n)).hash for n in ("calc-train", "sql-train", "files-train")
    }

    spec = tmp_path / "mixed.toml"
    spec.write_text(
        tiny_spec(
            "mixed",
            data={"train": "mixed-train", "family_weights": {"calculator": 1.0, "sql": 1.0, "files": 1.0}},
            learning={"steps": 2, "tasks_per_step": 3, "max_turns": 2, "tool_alarm_steps": 2},
            evaluation={"suites": ["calc-eval", "sql-eval", "files-eval"], "samples_per_task": 1},
        )
    )
    code, _, err = cli("run", str(spec))
    assert code == 0, err
    (run,) = run_ids(home)
    record = RunRecord(store, run)
    for step in (0, 1):
        rows = RolloutStore(record).query(f"step = {step} AND split = 'train'", columns=["task_id"])
        families = Counter(t.split("-", 1)[0] for t in set(rows.column("task_id").to_pylist()))
        assert families == {"calculator": 1, "sql": 1, "files": 1}, families  # one task of each, every step
    lines = [m for m in record.metrics().records if m.get("stage") is None]
    for line in lines:
        assert {"family/calculator/success", "family/sql/success", "family/files/success"} <= set(line)
        assert "exploration/sql/sql_query" in line and "exploration/calculator/calc" in line
    (oracle,) = [e for e in record.events().records if e["event"] == ORACLE_EVENT]
    assert oracle["solved"] == oracle["demonstrations"] == 192 and set(oracle["needed"]) == {
        "calculator",
        "sql",
        "files",
    }
    suites = {m.get("suite", "").split("@")[0] for m in record.metrics().records if m.get("stage") == "eval"}
    assert {"calc-eval", "sql-eval", "files-eval"} <= suites
    section = next(s for s in build_report(store, record).sections if s.key == "exploration")
    assert section.has_data and len(section.charts) == 2


def test_weights_that_do_not_fit_the_train_set_are_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = _home(tmp_path)
    cli = Cli(home, capsys)
    spec = tmp_path / "bad.toml"
    spec.write_text(tiny_spec("bad", data={"family_weights": {"calculator": 1.0, "sql": 1.0}}))
    line = cli.error("run", str(spec))
    assert "data.family_weights" in line and "sql" in line and "tasks merge" in line
    assert run_ids(home) == []
    spec.write_text(tiny_spec("bad", learning={"sft_steps": 1, "sft_demonstrations": 100000}))
    line = cli.error("run", str(spec))
    assert "learning.sft_demonstrations" in line and "at most" in line
    assert run_ids(home) == []


def test_an_sft_only_run_is_measured_at_step_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = _home(tmp_path)
    cli = Cli(home, capsys)
    spec = tmp_path / "sft.toml"
    learning = {"steps": 0, "sft_steps": 3, "sft_batch_size": 2, "sft_demonstrations": 5}
    spec.write_text(tiny_spec("sft-only", learning=learning))
    code, _, err = cli("run", str(spec))
    assert code == 0, err
    (run,) = run_ids(home)
    record = RunRecord(Store(home), run)
    assert record.status()["status"] == "succeeded"
    metrics = record.metrics().records
    sft = [m for m in metrics if m.get("stage") == "sft"]
    assert [m["step"] for m in sft] == [0, 1, 2] and all(m["sft_cpu_s"] > 0 for m in sft)
    assert not [m for m in metrics if m.get("stage") is None]  # no RL step
    assert {m["step"] for m in metrics if m.get("stage") == "eval"} == {0}
    assert RolloutStore(record).count("split = 'train'") == 0
    assert (record.path / "adapter" / "adapter_model.safetensors").is_file()
    # The warm start demonstrated the 5 train tasks its seed drew, and says which.
    (done,) = [e for e in record.events().records if e["event"] == "sft_done"]
    train = {t.id for t in Store(home).taskset(record.spec()["data"]["train"]).tasks}
    assert len(set(done["demonstrated"])) == 5 and set(done["demonstrated"]) <= train
