"""Rollback rules in a real training run (tiny model): planted eval outcomes, cost and unsafe actions.

The loop, trainer, checkpoints and records are real; where a scenario needs an outcome the tiny model
cannot produce (a required task that declines while the average rises, an unsafe action), the eval
point the loop computed is edited before the guard sees it.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from cli_support import tiny_training_store

from reprorl.cli.main import main
from reprorl.evaluation.guards import required_task_ids
from reprorl.evaluation.point import EvalPoint
from reprorl.evaluation.stats import mean_ci
from reprorl.orchestrate.pipeline import loop
from reprorl.store import RunRecord
from reprorl.types import TaskSet, Termination

SPEC = """
name = "tiny-guarded"
seed = 3
[model]
owner = "t@x"
base = "tiny"
adapter = { kind = "lora", rank = 4, alpha = 8.0, targets = ["q_proj", "v_proj"] }
[data]
owner = "t@x"
train = "calc-train"
reward_weights = { outcome = 1.0, valid_calls = 1.0 }
[learning]
owner = "t@x"
steps = 4
lr = 3e-3
group_size = 3
tasks_per_step = 2
max_tokens = 16
max_turns = 2
drop_zero_variance_groups = false
checkpoint_every = 1
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
every_steps = 2
"""


def _run(tmp_path: Path, extra: str) -> RunRecord:
    store = tiny_training_store(tmp_path)
    (tmp_path / "spec.toml").write_text(SPEC + extra)
    assert main(["--home", str(tmp_path / "home"), "run", str(tmp_path / "spec.toml")]) == 0
    (run_dir,) = [p for p in (tmp_path / "home" / "runs").iterdir() if not p.name.startswith(".")]
    return RunRecord(store, run_dir.name)


def _plant(monkeypatch: pytest.MonkeyPatch, edit: Any) -> None:
    """Let the loop compute each eval point, then `edit(step, point)` before anyone reads it."""
    real = loop.evaluate

    async def planted(*args: Any, **kwargs: Any) -> EvalPoint:
        point = await real(*args, **kwargs)
        return edit(kwargs["step"], point)  # type: ignore[no-any-return]

    monkeypatch.setattr(loop, "evaluate", planted)


def _events(record: RunRecord, kind: str) -> list[dict[str, Any]]:
    return [e for e in record.events().records if e["event"] == kind]


def test_a_required_task_that_declines_reverts_the_run_though_the_average_rose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with resources.as_file(resources.files("reprorl") / "examples" / "calc-eval.jsonl") as path:
        suite = TaskSet.from_jsonl("calc-eval", path.read_bytes())
    required_ids = required_task_ids(suite.tasks)  # the generator tags the first tasks of a split
    assert required_ids

    def edit(step: int, point: EvalPoint) -> EvalPoint:
        other = {0: 0.25, 2: 0.5, 4: 1.0}[step]  # the average rises at every point...
        mine = {0: 1.0, 2: 1.0, 4: 0.0}[step]  # ...while the required tasks fail at the last
        per_task = {t: (mine if t in required_ids else other) for t in point.per_task}
        return dataclasses.replace(point, per_task=per_task, success=mean_ci(list(per_task.values()), seed=0))

    _plant(monkeypatch, edit)
    rule = '\nrollback = [{ when = "required_task_decline", action = "revert", threshold = 0.1 }]\n'
    record = _run(tmp_path, rule)

    checks = _events(record, "guard_check")
    assert [(c["step"], c["passed"]) for c in checks] == [(0, True), (2, True), (4, False)]
    (fired,) = checks[2]["fired"]
    assert fired["when"] == "required_task_decline" and fired["action"] == "revert"
    assert set(json.dumps(fired["evidence"]).split('"')) >= set(required_ids)  # names the tasks
    evals = [m for m in record.metrics().records if m.get("stage") == "eval"]
    assert [e["eval/calc-eval/success"] for e in evals] == sorted(e["eval/calc-eval/success"] for e in evals)
    (reverted,) = _events(record, "reverted")
    assert reverted["step"] == 4 and reverted["to_step"] == 2
    at_two = next(e for e in evals if e["step"] == 2)["policy_version"]
    assert reverted["policy_version"] == at_two != evals[-1]["policy_version"]
    assert record.status()["status"] == "succeeded"
    # The weights the run ends with are the reverted ones: the offline eval names their version.
    capsys.readouterr()
    home = ["--home", str(tmp_path / "home")]
    assert main([*home, "eval", record.run_id, "--suite", "calc-eval@v1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policy_version"] == at_two


def test_an_unsafe_action_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def edit(step: int, point: EvalPoint) -> EvalPoint:
        if step != 2:
            return point
        first = point.result.trajectories[0].model_copy(update={"termination": Termination.UNSAFE_ACTION})
        result = dataclasses.replace(point.result, trajectories=[first, *point.result.trajectories[1:]])
        return dataclasses.replace(point, result=result)

    _plant(monkeypatch, edit)
    record = _run(tmp_path, '\nrollback = [{ when = "unsafe_action", action = "stop" }]\n')
    assert record.status()["status"] == "stopped"
    (stopped,) = _events(record, "stopped_by_rule")
    assert stopped["step"] == 2 and stopped["rules"] == ["unsafe_action"]
    steps = [m["step"] for m in record.metrics().records if m.get("stage") is None]
    assert steps == [0, 1]  # nothing trained after the unsafe point
    assert not _events(record, "adapter_saved")

    # With no warm start, step 0 measured the base itself (a zero LoRA update merges to the same
    # bits): the base model evaluated offline with the run's spec gives the same figures.
    monkeypatch.undo()
    home = ["--home", str(tmp_path / "home")]
    suite = ["--suite", "calc-eval@v1", "--json"]
    capsys.readouterr()
    assert main([*home, "eval", "tiny@v1", *suite]) == 2
    assert "--spec" in capsys.readouterr().err
    assert main([*home, "eval", "tiny@v1", "--spec", str(tmp_path / "spec.toml"), *suite]) == 0
    offline = json.loads(capsys.readouterr().out)
    assert offline["policy_version"].startswith("base:sha256:")
    first = next(m for m in record.metrics().records if m.get("stage") == "eval")
    in_loop = {k.removeprefix("eval/calc-eval/"): v for k, v in first.items() if k.startswith("eval/")}
    figures = offline["suites"][0]["metrics"]
    assert {k: v for k, v in figures.items() if "latency" not in k} == {
        k: v for k, v in in_loop.items() if "latency" not in k
    }


def test_a_cost_cap_stops_the_run(tmp_path: Path) -> None:
    priced = "\n[budget]\nmax_usd = 0.01\nprices = { completion_usd_per_mtok = 1000.0 }\n"
    record = _run(tmp_path, '\nrollback = [{ when = "cost_cap", action = "stop" }]\n' + priced)
    assert record.status()["status"] == "stopped"
    (check,) = [c for c in _events(record, "guard_check") if not c["passed"]]
    (fired,) = check["fired"]
    assert fired["when"] == "cost_cap" and fired["threshold"] == 0.01
    (stopped,) = _events(record, "stopped_by_rule")
    assert stopped["rules"] == ["cost_cap"]
    steps = [m for m in record.metrics().records if m.get("stage") is None]
    assert all(m["step"] < stopped["step"] for m in steps)
    assert not _events(record, "adapter_saved")
