"""Asynchronous training on the tiny model: staleness 0 is the synchronous loop, bit for bit; staleness k
samples ahead from exactly the versions the bound names, corrected by importance weights."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from cli_support import tiny_training_store

from reprorl.config import RunSpec, load_spec, resolve_spec
from reprorl.orchestrate.async_train import version_for
from reprorl.orchestrate.reproduce import result_figures
from reprorl.orchestrate.train import train_run
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore

pytestmark = pytest.mark.slow

SPEC = """
name = "tiny-async"
seed = 11
[model]
owner = "t@x"
base = "tiny"
adapter = { kind = "lora", rank = 4, alpha = 8.0, targets = ["q_proj", "v_proj"] }
[data]
owner = "t@x"
train = "calc-train"
# The tiny model never answers right; a component that varies gives its groups a signal.
reward_weights = { outcome = 1.0, valid_calls = 1.0 }
[learning]
owner = "t@x"
loss = "ppo_ewma"
steps = 4
sft_steps = 1
lr = 1e-3
group_size = 2
tasks_per_step = 2
max_tokens = 12
max_turns = 2
drop_zero_variance_groups = false
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
every_steps = 2
"""

# Figures only the asynchronous loop logs; everything else is shared with the synchronous one.
ASYNC_ONLY = {"staleness_mean", "staleness_max"}


def _spec(store: Store, tmp_path: Path, *overrides: str) -> RunSpec:
    path = tmp_path / "spec.toml"
    path.write_text(SPEC)
    return resolve_spec(load_spec(path, list(overrides), pin_bare=store.pin_newest), store.pin)


def _outcome(record: RunRecord) -> dict[str, Any]:
    assert record.status()["status"] == "succeeded"
    rollouts = sorted(
        (
            t.rollout_id.split("/", 1)[1],
            t.policy_version,
            # What every record says about how it was sampled, besides the tokens.
            (t.prompt_template_hash, t.base_model_hash, t.env_version, sorted(t.sampler.items())),
            t.reward.total if t.reward else None,
            [(turn.token_ids, turn.logprobs, turn.batch and len(turn.batch)) for turn in t.turns],
        )
        for t in RolloutStore(record).trajectories()
    )
    saved = [e["adapter"] for e in record.events().records if e.get("event") == "adapter_saved"]
    return {"adapter": saved[-1], "metrics": result_figures(record), "rollouts": rollouts}


def test_async_with_staleness_0_is_bit_identical_to_the_synchronous_loop(tmp_path: Path) -> None:
    store = tiny_training_store(tmp_path)
    sync = asyncio.run(train_run(store, _spec(store, tmp_path)))
    asynchronous = asyncio.run(
        train_run(store, _spec(store, tmp_path, "learning.mode=async", "learning.max_staleness=0"))
    )
    want, got = _outcome(sync), _outcome(asynchronous)
    assert got["adapter"] == want["adapter"]
    assert got["rollouts"] == want["rollouts"]
    assert len(got["metrics"]) == len(want["metrics"])
    for mine, theirs in zip(got["metrics"], want["metrics"], strict=True):
        if mine.get("stage") is None:  # a training step
            assert {k for k in mine if k not in theirs} == ASYNC_ONLY
            assert mine["staleness_max"] == 0.0
        shared = {k: v for k, v in mine.items() if k not in ASYNC_ONLY}
        assert shared == theirs, (mine.get("step"), mine.get("stage"))


def test_async_samples_ahead_from_the_versions_the_bound_names(tmp_path: Path) -> None:
    store = tiny_training_store(tmp_path)
    spec = _spec(
        store,
        tmp_path,
        "learning.mode=async",
        "learning.max_staleness=2",
        "evaluation.every_steps=4",
        "learning.correction=mis",
    )
    record = asyncio.run(train_run(store, spec))
    assert record.status()["status"] == "succeeded"
    lines = record.metrics().records
    steps = [m for m in lines if m.get("stage") is None]
    # Version max(s - 2, last eval point): steps 0..3 sample from versions 0, 0, 0, 1.
    assert [version_for(s, 2, 4) for s in range(4)] == [0, 0, 0, 1]
    assert [m["staleness_max"] for m in steps] == [0.0, 1.0, 2.0, 2.0]
    for m in steps:
        assert m["train/is_weight_min"] <= m["train/is_weight_mean"] <= m["train/is_weight_max"]
        # Masked IS zeroes tokens whose ratio exceeds the cap and keeps the rest as they are.
        assert m["train/is_weight_max"] <= min(m["train/is_ratio_max"], spec.learning.tis_cap)
        for key in ("timing/queue_depth", "timing/trainer_busy", "timing/wait_s", "timing/env_share"):
            assert key in m, key
    # Each step's rollouts were sampled from exactly the version its line names, and steps 0-2
    # (one version) from the weights the step-0 eval point measured.
    evals = {m["step"]: m["policy_version"] for m in lines if m.get("stage") == "eval"}
    versions: dict[int, set[str]] = {}
    for t in RolloutStore(record).trajectories("split = 'train'"):
        versions.setdefault(t.step, set()).update(turn.policy_version for turn in t.turns)
    for m in steps:
        assert versions[m["step"]] == {m["policy_version"]}
    assert {steps[s]["policy_version"] for s in (0, 1, 2)} == {evals[0]}
    # Every planned rollout once: nothing sampled twice, nothing dropped.
    planned = 4 * spec.learning.tasks_per_step * spec.learning.group_size
    ids = [t.rollout_id for t in RolloutStore(record).trajectories("split = 'train' AND NOT retried")]
    assert len(ids) == len(set(ids)) == planned


def test_turning_the_correction_off_is_recorded(tmp_path: Path) -> None:
    store = tiny_training_store(tmp_path)
    spec = _spec(
        store,
        tmp_path,
        "learning.mode=async",
        "learning.max_staleness=1",
        "learning.correction=none",
        "learning.steps=1",
        "learning.sft_steps=0",
    )
    record = asyncio.run(train_run(store, spec))
    (event,) = [e for e in record.events().records if e.get("event") == "off_policy_correction_off"]
    assert event["field"] == "learning.correction" and event["max_staleness"] == 1
    (step,) = [m for m in record.metrics().records if m.get("stage") is None]
    assert step["train/is_weight_min"] == step["train/is_weight_max"] == 1.0


def _assembled(record: RunRecord) -> list[dict[str, Any]]:
    return [e for e in record.events().records if e.get("event") == "batch_assembled"]


@pytest.mark.parametrize("staleness", [0, 2])
def test_arrival_batches_train_every_group_once_within_the_bound(tmp_path: Path, staleness: int) -> None:
    """Groups go to the trainer as they finish: each step's batch is whole, every planned group is
    trained exactly once, none later than the bound or across an eval point, and each rollout was
    sampled from the version its step's event names. At staleness 0 that is the planned batches."""
    store = tiny_training_store(tmp_path)
    spec = _spec(
        store,
        tmp_path,
        "learning.mode=async",
        "learning.assembly=arrival",
        "learning.lockstep=arrival",
        f"learning.max_staleness={staleness}",
        "learning.steps=5",
        "evaluation.every_steps=3",
    )
    record = asyncio.run(train_run(store, spec))
    assert record.status()["status"] == "succeeded"
    events = _assembled(record)
    assert [e["step"] for e in events] == list(range(5))
    tasks = spec.learning.tasks_per_step
    trained = [g["group"] for e in events for g in e["groups"]]
    assert sorted(trained) == list(range(5 * tasks))  # each once, none dropped
    versions: dict[str, set[str]] = {}
    for t in RolloutStore(record).trajectories("split = 'train'"):
        versions.setdefault(t.group_id, set()).update(turn.policy_version for turn in t.turns)
    lines = {m["step"]: m for m in record.metrics().records if m.get("stage") is None}
    published = {m["step"]: m["policy_version"] for m in record.metrics().records if m.get("stage") == "eval"}
    for e in events:
        step, groups = e["step"], e["groups"]
        assert len(groups) == tasks
        lags = [step - g["version"] for g in groups]
        assert all(0 <= lag <= staleness for lag in lags)
        # Eval points (steps 0 and 3) are barriers: nothing sampled before one trains after it.
        assert all((g["version"] >= 3) == (step >= 3) for g in groups)
        assert lines[step]["staleness_max"] == max(lags)
        assert lines[step]["staleness_mean"] == pytest.approx(sum(lags) / len(lags))
        for g in groups:
            assert g["planned_step"] == g["group"] // tasks
            assert len(versions[g["group_id"]]) == 1
            if g["version"] in published:  # the weights an eval point measured
                assert versions[g["group_id"]] == {published[g["version"]]}
        if staleness == 0:
            assert [g["planned_step"] for g in groups] == [step] * tasks
            assert lags == [0] * tasks
    ids = [t.rollout_id for t in RolloutStore(record).trajectories("split = 'train' AND NOT retried")]
    assert len(ids) == len(set(ids)) == 5 * tasks * spec.learning.group_size
