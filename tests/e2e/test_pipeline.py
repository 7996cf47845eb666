"""The one training loop, composed of a source, an executor and a timing, on the tiny model: every
combination gives what it promises — staleness 0 is synchronous training, written out here as a
reference loop; a staleness bound samples ahead from exactly the versions it names; arrival order
with a recorded timing reproduces its run bit for bit; Ray actors give the in-process results."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_support import Cli, run_ids, tiny_spec, tiny_training_store

from reprorl.config import RunSpec, load_spec, resolve_spec
from reprorl.orchestrate.jobs.reproduce import result_figures
from reprorl.orchestrate.jobs.train import train_run
from reprorl.orchestrate.pipeline.planned import version_for
from reprorl.orchestrate.pipeline.steps import group_data, learning_rate, make_loss, prepare
from reprorl.orchestrate.pipeline.versions import trained_version
from reprorl.orchestrate.run.policies import OpenedPolicy, load_run_base
from reprorl.orchestrate.run.rollouts import load_taskset, runner_for, step_tasks
from reprorl.orchestrate.run.setup import build_trainer
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import LocalSampler
from reprorl.rollout.episode import Provenance
from reprorl.rollout.runner import plan_groups
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.trainer import AdamParams
from reprorl.trainer.snapshot import SamplingSnapshot
from reprorl.types import Split, Trajectory

pytestmark = pytest.mark.slow

SPEC = tiny_spec(
    "tiny-pipeline",
    seed=11,
    learning={"loss": "ppo_ewma", "steps": 4, "sft_steps": 1},
    evaluation={"every_steps": 2},
)


def _spec(store: Store, tmp_path: Path, *overrides: str) -> RunSpec:
    path = tmp_path / "spec.toml"
    path.write_text(SPEC)
    return resolve_spec(load_spec(path, list(overrides), pin_bare=store.pin_newest), store.pin)


def _row(t: Trajectory) -> tuple[Any, ...]:
    """What a rollout says of how it was sampled: its id in the run, its version, its tokens."""
    return (t.rollout_id.split("/", 1)[1], t.policy_version, [(x.token_ids, x.logprobs) for x in t.turns])


def _train_rollouts(record: RunRecord) -> list[tuple[Any, ...]]:
    return sorted(_row(t) for t in RolloutStore(record).trajectories("split = 'train'"))


def _outcome(record: RunRecord) -> dict[str, Any]:
    assert record.status()["status"] == "succeeded"
    rollouts = sorted(_row(t) for t in RolloutStore(record).trajectories())
    saved = [e["adapter"] for e in record.events().records if e.get("event") == "adapter_saved"]
    return {"adapter": saved[-1], "metrics": result_figures(record), "rollouts": rollouts}


async def _reference_sync(store: Store, spec: RunSpec, run_id: str) -> tuple[list[tuple[Any, ...]], str]:
    """The synchronous loop written out from the library's parts: each step samples its groups from
    the weights as they are, then trains on them. Its train rollouts and final weights' version."""
    learning = spec.learning
    loaded = load_run_base(store, spec)
    trainer = build_trainer(store, loaded, spec)
    loss = make_loss(learning)
    tasks = load_taskset(store, str(spec.data.train)).split(Split.TRAIN)
    renderer = ChatRenderer(loaded.tokenizer)
    snapshot = SamplingSnapshot(trainer, getattr(torch, spec.model.sampling_dtype))
    sampler = LocalSampler(snapshot.model, loaded.tokenizer, model_hash=loaded.base_hash, policy_version="")
    provenance = Provenance(loaded.base_hash, None, renderer.template_hash, sampler.info())
    opened = OpenedPolicy(loaded, sampler, renderer, provenance)
    rows = []
    async with runner_for(opened, spec, run_id, store.root, families={"calculator"}) as runner:
        for step in range(learning.steps):
            snapshot.refresh()
            sampler.policy_version = trained_version(trainer)
            jobs = plan_groups(
                step_tasks(tasks, spec, step),
                learning.group_size,
                run_id=run_id,
                run_seed=spec.seed,
                step=step,
            )
            result = await runner.run(jobs)
            rows += [
                (
                    t.rollout_id.split("/", 1)[1],
                    t.policy_version,
                    [(x.token_ids, x.logprobs) for x in t.turns],
                )
                for t in result.trajectories
            ]
            data, _ = group_data(result.trajectories, learning)
            trainer.forward_backward(prepare(trainer, data, loss, None), loss)
            trainer.optim_step(AdamParams(lr=learning_rate(learning, step)))
    return sorted(rows), trained_version(trainer)


def _synchronous(store: Store, tmp_path: Path) -> None:
    spec = _spec(store, tmp_path, "learning.loss=ppo_clip", "learning.sft_steps=0")
    record = asyncio.run(train_run(store, spec))
    assert record.status()["status"] == "succeeded"
    rows, final = asyncio.run(_reference_sync(store, spec, record.run_id))
    assert _train_rollouts(record) == rows
    last_eval = [m for m in record.metrics().records if m.get("stage") == "eval"][-1]
    assert last_eval["step"] == spec.learning.steps and last_eval["policy_version"] == final
    steps = [m for m in record.metrics().records if m.get("stage") is None]
    assert [m["staleness_max"] for m in steps] == [0.0] * spec.learning.steps


def _planned_ahead(store: Store, tmp_path: Path) -> None:
    spec = _spec(
        store,
        tmp_path,
        "learning.pipeline.max_staleness=2",
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


def _arrival_recorded(store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Arrival order and the ready lockstep let timing decide which version samples each group, which
    step trains it and which turns share a sampling batch (whose floats depend on it); the rerun
    follows what the record says of each, and gives back every figure and the weights."""
    (tmp_path / "spec.toml").write_text(SPEC)
    cli = Cli(tmp_path / "home", capsys)
    arrival = [
        "learning.pipeline.source=arrival",
        "learning.pipeline.lockstep=ready",
        "learning.pipeline.max_staleness=2",
        "evaluation.every_steps=4",
        # Tool calls that take varying time, so groups finish out of order.
        "data.noise.latency_s=0.05",
        "data.noise.latency_sigma=1.0",
    ]
    code, _, err = cli("run", str(tmp_path / "spec.toml"), *arrival)
    assert code == 0, err
    (run_id,) = run_ids(tmp_path / "home")
    record = RunRecord(store, run_id)
    assembled = [e for e in record.events().records if e.get("event") == "batch_assembled"]
    assert len(assembled) == 4 and max(e["step"] - g["version"] for e in assembled for g in e["groups"]) > 0
    result = cli.ok_json("reproduce", run_id)
    assert result["matches"] and result["differences"] == [] and result["timing_dependent"] == []
    assert result["schedule"]["diverged"] is None
    batches = {
        tuple(turn.batch) for t in RolloutStore(record).trajectories() for turn in t.turns if turn.batch
    }
    assert result["schedule"]["followed"] == (
        f"{len(batches)} sampling batches as recorded, 8 groups from their recorded versions into 4 steps"
    )
    again = [
        e for e in RunRecord(store, result["rerun"]).events().records if e.get("event") == "batch_assembled"
    ]
    assert [e["groups"] for e in again] == [
        [{**g, "group_id": g["group_id"].replace(run_id, result["rerun"])} for g in e["groups"]]
        for e in assembled
    ]


def _ray(store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ray = pytest.importorskip("ray")
    workers = ["learning.pipeline.max_staleness=1", "learning.pipeline.workers=2", "learning.steps=3"]
    try:
        local = asyncio.run(train_run(store, _spec(store, tmp_path, *workers)))
        code, out, err = Cli(tmp_path / "home", capsys)(
            "run", str(tmp_path / "spec.toml"), *workers, "--ray", "local"
        )
    finally:
        if ray.is_initialized():
            ray.shutdown()
    assert code == 0, err
    remote = RunRecord(store, run_ids(tmp_path / "home")[-1])
    assert remote.run_id != local.run_id and remote.run_id in out
    events = remote.events().records
    (trainer,) = [e for e in events if e.get("event") == "trainer_actor"]
    (started,) = [e for e in events if e.get("event") == "rollout_workers"]
    assert started["backend"] == "ray" and len(started["workers"]) == 2
    processes = {trainer["pid"], *(w["pid"] for w in started["workers"])}
    assert len(processes) == 3 and os.getpid() not in processes  # the CLI only follows the run
    assert _outcome(remote) == _outcome(local)
    effective = json.loads((remote.path / "effective.json").read_text())["fields"]
    assert effective["learning.pipeline.workers"] == 2 and effective["learning.pipeline.source"] == "planned"


COMBINATIONS: dict[str, Callable[..., None]] = {
    "planned-staleness0-local-live (synchronous)": _synchronous,
    "planned-staleness2-local-live": _planned_ahead,
    "arrival-staleness2-local-recorded": _arrival_recorded,
    "planned-staleness1-ray2-live": _ray,
}


@pytest.mark.parametrize("combination", list(COMBINATIONS))
def test_each_pipeline_combination_gives_what_it_promises(
    combination: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tiny_training_store(tmp_path)
    check = COMBINATIONS[combination]
    if "capsys" in check.__code__.co_varnames:
        check(store, tmp_path, capsys)
    else:
        check(store, tmp_path)


def test_turning_the_correction_off_is_recorded(tmp_path: Path) -> None:
    store = tiny_training_store(tmp_path)
    spec = _spec(
        store,
        tmp_path,
        "learning.pipeline.max_staleness=1",
        "learning.correction=none",
        "learning.steps=1",
        "learning.sft_steps=0",
    )
    record = asyncio.run(train_run(store, spec))
    (event,) = [e for e in record.events().records if e.get("event") == "off_policy_correction_off"]
    assert event["field"] == "learning.correction" and event["max_staleness"] == 1
    (step,) = [m for m in record.metrics().records if m.get("stage") is None]
    assert step["train/is_weight_min"] == step["train/is_weight_max"] == 1.0


def test_arrival_batches_train_every_group_once_within_the_bound(tmp_path: Path) -> None:
    """Groups go to the trainer as they finish: each step's batch is whole, every planned group is
    trained exactly once, none later than the bound or across an eval point, and each rollout was
    sampled from the version its step's event names."""
    staleness = 2
    store = tiny_training_store(tmp_path)
    spec = _spec(
        store,
        tmp_path,
        "learning.pipeline.source=arrival",
        "learning.pipeline.lockstep=ready",
        f"learning.pipeline.max_staleness={staleness}",
        "learning.steps=5",
        "evaluation.every_steps=3",
    )
    record = asyncio.run(train_run(store, spec))
    assert record.status()["status"] == "succeeded"
    events = [e for e in record.events().records if e.get("event") == "batch_assembled"]
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
