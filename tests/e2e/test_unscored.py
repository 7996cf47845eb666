"""A run whose verifier fails on most rollouts: they are left out, counted by class, and the run stops."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import run_ids, tiny_training_store
from planted_verifiers import HangsOnThreeInFive

from reprorl.cli.main import main
from reprorl.rollout.families import FAMILIES
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore

SPEC = """
name = "tiny-unscored"
seed = 3
[model]
owner = "t@x"
base = "tiny"
adapter = {{ kind = "lora", rank = 4, alpha = 8.0, targets = ["q_proj", "v_proj"] }}
[data]
owner = "t@x"
train = "calc-train"
reward_weights = {{ outcome = 1.0, valid_calls = 1.0 }}
verifier_timeout_s = 1.0
[learning]
owner = "t@x"
steps = 2
lr = 1e-3
group_size = 5
tasks_per_step = 2
max_tokens = 8
max_turns = 1
drop_zero_variance_groups = false
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
every_steps = 10
{limit}
"""


@pytest.fixture
def planted(tmp_path: Path) -> Iterator[Path]:
    verifier = HangsOnThreeInFive(str(tmp_path / "ledger"), hang_s=20.0)
    family = dataclasses.replace(FAMILIES["calculator"], verifier=verifier, cross=())
    with FAMILIES.override("calculator", family):
        tiny_training_store(tmp_path)
        yield tmp_path / "home"


def _run(tmp_path: Path, home: Path, limit: str) -> RunRecord:
    (tmp_path / "spec.toml").write_text(SPEC.format(limit=limit))
    before = set(run_ids(home))
    main(["--home", str(home), "run", str(tmp_path / "spec.toml")])
    (run_id,) = set(run_ids(home)) - before
    return RunRecord(Store(home), run_id)


def test_a_step_past_the_unscored_limit_is_not_trained_on_and_stops_the_run(
    tmp_path: Path, planted: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = _run(tmp_path, planted, "")
    status = record.status()
    assert status["status"] == "stopped" and "max_unscored_share" in status["reason"]
    (line,) = [m for m in record.metrics().records if m.get("stage") is None]
    assert line["step"] == 0 and line["rollouts"] == 10.0
    assert line["unscored"] == 6.0 and line["unscored_share"] == pytest.approx(0.6)
    assert line["excluded/verifier_timeout"] == 6.0 and line["excluded/infra_error"] == 0.0
    assert line["trained_sequences"] == 0.0 and not any(k.startswith("train/") for k in line)
    (event,) = [e for e in record.events().records if e.get("event") == "stopped_by_rule"]
    assert event["rules"] == ["max_unscored_share"] and event["excluded"] == {"verifier_timeout": 6}
    assert not (record.path / "adapter").exists()  # a stopped run registers no trained weights

    out = tmp_path / "report.html"
    assert main(["--home", str(planted), "runs", "report", record.run_id, "--output", str(out)]) == 0
    assert "6 (60% of 10): verifier_timeout 6" in out.read_text()


def test_unscored_rollouts_are_left_out_of_the_update_and_never_count_as_reward_0(
    tmp_path: Path, planted: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = _run(tmp_path, planted, "max_unscored_share = 0.7")
    assert record.status()["status"] == "succeeded"
    lines = [m for m in record.metrics().records if m.get("stage") is None]
    assert [m["unscored"] for m in lines] == [6.0, 6.0]
    rollouts = [t for t in RolloutStore(record).trajectories() if t.split.value == "train" and not t.retried]
    for step, line in enumerate(lines):
        scored = [t for t in rollouts if t.step == step and t.reward is not None]
        assert len(scored) == 4 and line["trained_sequences"] == 4.0  # only the scored ones trained
        mean = sum(t.reward.total for t in scored if t.reward) / 4
        assert line["reward_mean"] == pytest.approx(mean)  # not diluted by six zeros
        unscored = [t for t in rollouts if t.step == step and t.reward is None]
        assert len(unscored) == 6
        assert {t.score_failure.value if t.score_failure else None for t in unscored} == {"verifier_timeout"}
