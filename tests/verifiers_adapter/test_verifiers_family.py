"""A verifiers v1 taskset as a reprorl family: its tasks content-hashed with their own hash recorded,
its `@vf.reward`s the reward components; the oracle scores 1.0 and the tiny model trains two steps.

The taskset is docs/verifiers.md's block, as written, saved as the module `arith_taskset`."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import Cli, run_ids, tiny_spec, tiny_training_store
from vf_support import docs_family, episodes

from reprorl.store import find_run
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import TaskSet


@pytest.fixture
def family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with docs_family("class SumTaskset(", "arith_taskset", tmp_path, monkeypatch) as made:
        yield made


def test_the_tasks_carry_their_data_and_the_tasksets_hash_of_it(family: Any) -> None:
    import verifiers.v1 as vf

    SumTaskset = importlib.import_module("arith_taskset").SumTaskset
    sets = family.generate(0, train=10, eval=4, holdout=2)
    tasks = [t for split in sets.values() for t in split.tasks]
    assert len(tasks) == 16 and len({t.id for t in tasks}) == 16  # every task dealt once
    own = {t.hash: t for t in SumTaskset(vf.TasksetConfig())}
    for task in tasks:
        vf_hash = task.reference["hash"]
        assert f"verifiers:{vf_hash}" in task.tags and vf_hash in own
        assert task.prompt[-1].content == own[vf_hash].data.prompt
    assert family.generate(0, train=10, eval=4, holdout=2) == sets  # the seed fixes the deal


def test_the_oracle_scores_one_and_a_wrong_answer_does_not(family: Any) -> None:
    for t in episodes(family, family.oracle, 3):
        assert t.reward is not None, t.error
        assert t.reward.components == {
            "outcome": 1.0,
            "vf/brief": 1.0,
            "vf/correct": 1.0,
            "valid_calls": 1.0,
            "permission_respected": 1.0,
            "failed_calls": 0.0,
        }
    for t in episodes(family, lambda task, messages: "I do not know the answer to that one.", 3):
        assert t.reward is not None and t.reward.components["vf/correct"] == 0.0
        assert t.reward.components["outcome"] == 0.0  # neither right nor brief


def test_the_tiny_model_trains_on_it_and_the_data_hash_is_in_the_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], family: Any
) -> None:
    store = tiny_training_store(tmp_path)
    cli = Cli(tmp_path / "home", capsys)
    code, _, err = cli("tasks", "generate", "vf-sum", "--train", "8", "--eval", "4", "--holdout", "0")
    assert code == 0, err
    spec = tiny_spec(
        "vf-train",
        data={"train": "vf-sum-train", "reward_weights": {"outcome": 1.0}},
        evaluation={"suites": ["vf-sum-eval"]},
    )
    (tmp_path / "spec.toml").write_text(spec)
    code, _, err = cli("run", str(tmp_path / "spec.toml"))
    assert code == 0, err
    (run_id,) = run_ids(tmp_path / "home")
    record = find_run(store, run_id)
    steps = [m for m in record.metrics().records if m.get("stage") is None]
    assert [m["step"] for m in steps] == [0, 1] and any(m["train/grad_norm"] > 0 for m in steps)
    train = TaskSet.from_jsonl(
        "vf-sum-train", store.read(json.loads((record.path / "spec.json").read_text())["data"]["train"])
    )
    hashes = {t.id: t.reference["hash"] for t in train.tasks}
    rollouts = list(RolloutStore(record).trajectories("split = 'train'"))
    assert rollouts and all(t.task_id in hashes and t.reward is not None for t in rollouts)
    # Each rollout names the verifiers task it ran by verifiers' own hash of its data.
    assert all(t.env["kind"] == "verifiers" and t.env["task_hash"] == hashes[t.task_id] for t in rollouts)
    assert all("vf/correct" in t.reward.components for t in rollouts if t.reward)
