"""`reprorl runs compare`: paired on one suite version; two versions are refused, or shown apart if asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import tiny_training_store

from reprorl.cli.main import main
from reprorl.orchestrate.run.rollouts import load_taskset
from reprorl.types import TaskSet

SPEC = """
name = "tiny-compare"
seed = {seed}
[model]
owner = "t@x"
base = "tiny"
adapter = {{ kind = "lora", rank = 4, alpha = 8.0, targets = ["q_proj", "v_proj"] }}
[data]
owner = "t@x"
train = "calc-train"
reward_weights = {{ outcome = 1.0, valid_calls = 1.0 }}
[learning]
owner = "t@x"
steps = 1
lr = 1e-3
group_size = 2
tasks_per_step = 1
max_tokens = 12
max_turns = 2
[evaluation]
owner = "t@x"
suites = ["{suite}"]
"""


def test_compare_pairs_runs_on_one_suite_version_and_refuses_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tiny_training_store(tmp_path)
    # A regression suite grows by cases: the same name with one more task is its next version.
    v1 = load_taskset(store, "calc-eval@v1")
    extra = v1.tasks[0].model_copy(update={"id": "calc-eval-regression-1", "prompt": v1.tasks[1].prompt})
    store.add_bytes(
        "calc-eval", TaskSet(name="calc-eval", tasks=(*v1.tasks, extra)).to_jsonl(), kind="taskset"
    )
    home = ["--home", str(tmp_path / "home")]
    runs = []
    for seed, suite in ((1, "calc-eval@v1"), (2, "calc-eval@v1"), (3, "calc-eval@v2")):
        (tmp_path / "spec.toml").write_text(SPEC.format(seed=seed, suite=suite))
        capsys.readouterr()
        assert main([*home, "run", str(tmp_path / "spec.toml")]) == 0
        runs.append(capsys.readouterr().out.split("run ", 1)[1].split()[0])

    assert main([*home, "runs", "compare", runs[0], runs[1], "--suite", "calc-eval@v1", "--json"]) == 0
    paired = json.loads(capsys.readouterr().out)
    assert paired["comparable"] and paired["a"]["tasks"] == paired["b"]["tasks"] == 32
    diff = paired["difference"]
    assert diff["b_minus_a"] == pytest.approx(paired["b"]["success"] - paired["a"]["success"])
    assert diff["low"] <= diff["b_minus_a"] <= diff["high"] and 0.0 <= diff["p_value"] <= 1.0

    # Another version of the suite: refused with the reason, naming both versions...
    assert main([*home, "runs", "compare", runs[0], runs[2], "--suite", "calc-eval"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "calc-eval@v1" in err and "calc-eval@v2" in err and "not comparable" in err
    # ...unless both are asked for: each run on its own version, no difference.
    assert main([*home, "runs", "compare", runs[0], runs[2], "--suite", "calc-eval", "--both", "--json"]) == 0
    apart = json.loads(capsys.readouterr().out)
    assert not apart["comparable"] and "difference" not in apart
    assert (apart["a"]["version"], apart["a"]["tasks"]) == ("calc-eval@v1", 32)
    assert (apart["b"]["version"], apart["b"]["tasks"]) == ("calc-eval@v2", 33)

    # A regression suite grows from a run's failures: each addition is the next version, a case
    # it already holds changes nothing.
    eval_ids = sorted(t.id for t in v1.tasks)[:3]
    picks = [
        f"split = 'eval' AND task_id IN ('{eval_ids[0]}', '{eval_ids[1]}')",
        f"task_id = '{eval_ids[2]}'",
    ]
    assert main([*home, "tasks", "regression", "calc-regress", "--run", runs[0], "--where", picks[0]]) == 0
    assert "calc-regress@v1: 2 cases (2 new" in capsys.readouterr().out
    assert main([*home, "tasks", "regression", "calc-regress", "--run", runs[0], "--where", picks[1]]) == 0
    assert "calc-regress@v2: 3 cases (1 new" in capsys.readouterr().out
    assert main([*home, "tasks", "regression", "calc-regress", "--run", runs[0], "--where", picks[1]]) == 0
    assert "calc-regress@v2: unchanged" in capsys.readouterr().out
    grown = load_taskset(store, "calc-regress@v2")
    assert [t.id for t in grown.tasks] == ["calc-regress-0001", "calc-regress-0002", "calc-regress-0003"]
    assert all("regression" in t.tags and t.split.value == "eval" for t in grown.tasks)
    assert load_taskset(store, "calc-regress@v1").tasks == grown.tasks[:2]
