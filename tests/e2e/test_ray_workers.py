"""Ray actors on a local cluster: a worker killed mid-run costs its episodes an infra-failure record
and a retry, not the run; a trainer actor that dies fails the run and a resume finishes it. (That
they give the in-process bytes is one of test_pipeline.py's combinations.)"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import tiny_training_store

from reprorl.config import RunSpec, load_spec, resolve_spec
from reprorl.orchestrate.jobs.reproduce import result_figures
from reprorl.orchestrate.jobs.train import train_run
from reprorl.orchestrate.pipeline.ray_workers import RayBatches
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import Termination

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

TASKS, GROUP = 4, 2
SPEC = f"""
name = "tiny-ray"
seed = 17
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
pipeline = {{ max_staleness = 1, workers = 2 }}
steps = 3
lr = 1e-3
group_size = {GROUP}
tasks_per_step = {TASKS}
max_tokens = 16
max_turns = 2
drop_zero_variance_groups = false
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
every_steps = 100
"""


@pytest.fixture(scope="module", autouse=True)
def local_cluster() -> Iterator[None]:
    yield
    if ray.is_initialized():
        ray.shutdown()


def _spec(store: Store, tmp_path: Path, *overrides: str) -> RunSpec:
    path = tmp_path / "spec.toml"
    path.write_text(SPEC)
    return resolve_spec(load_spec(path, list(overrides), pin_bare=store.pin_newest), store.pin)


def _outcome(record: RunRecord) -> dict[str, Any]:
    assert record.status()["status"] == "succeeded"
    rollouts = sorted(
        (t.rollout_id.split("/", 1)[1], t.policy_version, [(x.token_ids, x.logprobs) for x in t.turns])
        for t in RolloutStore(record).trajectories()
    )
    saved = [e["adapter"] for e in record.events().records if e.get("event") == "adapter_saved"]
    return {"adapter": saved[-1], "metrics": result_figures(record), "rollouts": rollouts}


def test_a_worker_killed_mid_run_is_an_infra_failure_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tiny_training_store(tmp_path)
    # Sampling outweighs training here (8 groups of 4, longer turns), so a batch takes seconds.
    spec = _spec(
        store,
        tmp_path,
        "learning.steps=4",
        "learning.pipeline.max_staleness=2",
        "learning.tasks_per_step=8",
        "learning.group_size=4",
        "learning.max_tokens=48",
    )
    # Tell the killer when a batch's shares have reached the workers: the kill then lands inside
    # it. The second batch, so the run is under way.
    dispatched = threading.Semaphore(0)
    real_run = RayBatches.run

    async def run(self: RayBatches, version: Any, jobs: Any) -> Any:
        batch = asyncio.ensure_future(real_run(self, version, jobs))
        await asyncio.sleep(0.3)
        dispatched.release()
        return await batch

    monkeypatch.setattr(RayBatches, "run", run)
    killed: list[str] = []

    def kill_a_worker() -> None:
        for _ in range(2):
            if not dispatched.acquire(timeout=300):
                return
        (run_dir,) = (tmp_path / "home" / "runs").glob("2*")
        events = RunRecord(store, run_dir.name).events().records
        (started,) = [e for e in events if e.get("event") == "rollout_workers"]
        name = started["workers"][1]["name"]
        ray.kill(ray.get_actor(name, namespace="reprorl"))
        killed.append(name)

    killer = threading.Thread(target=kill_a_worker)
    killer.start()
    record = asyncio.run(train_run(store, spec, ray="local"))
    killer.join()
    assert killed, "the worker was not killed"
    assert record.status()["status"] == "succeeded"
    (lost,) = [e for e in record.events().records if e.get("event") == "rollout_workers_lost"]
    assert killed[0] in lost["workers"][0]
    rollouts = list(RolloutStore(record).trajectories("split = 'train'"))
    failed = [t for t in rollouts if t.retried and t.termination is Termination.INFRA_ERROR]
    assert failed and all(killed[0] in (t.error or "") for t in failed)
    # Each lost episode ran again and counts; every planned rollout has exactly one final record.
    finals = {t.rollout_id: t for t in rollouts if not t.retried}
    assert len(finals) == 4 * 8 * 4
    for t in failed:
        again = finals[t.rollout_id.split("~", 1)[0]]
        assert again.termination is not Termination.INFRA_ERROR and again.infra_retries >= 1


def test_a_trainer_actor_that_dies_fails_the_run_and_resume_finishes_it(tmp_path: Path) -> None:
    from reprorl.orchestrate.jobs.ray_trainer import train_on_ray
    from reprorl.orchestrate.jobs.train import prepare_run
    from reprorl.orchestrate.run.checkpoint import STEP_PREFIX, checkpoints_root

    store = tiny_training_store(tmp_path)
    spec = _spec(store, tmp_path, "learning.steps=4", "learning.checkpoint_every=1")
    record = prepare_run(store, spec)
    killed: list[str] = []
    ended = threading.Event()

    def kill_the_trainer() -> None:
        # Once the checkpoint after two updates is renamed into place, the trainer's process goes (the
        # second update's metric line comes before that checkpoint: killed between them, a run
        # resumes from step 1). It watches for as long as the run lasts, however loaded the machine.
        while not ended.is_set():
            if (checkpoints_root(record) / f"{STEP_PREFIX}{2:06d}").is_dir():
                ray.kill(ray.get_actor(f"trainer-{record.run_id}", namespace="reprorl"))
                killed.append(record.run_id)
                return
            ended.wait(0.2)

    killer = threading.Thread(target=kill_the_trainer)
    killer.start()
    try:
        with pytest.raises(ray.exceptions.RayActorError):
            asyncio.run(train_on_ray(store, spec, record, address="local"))
    finally:
        ended.set()
        killer.join()
    assert killed, "the trainer was not killed"
    status = record.status()
    assert status["status"] == "failed" and "trainer actor died" in status["error"]
    done, failures = asyncio.run(train_on_ray(store, spec, record, address="local", resume=True))
    assert failures == [] and done.status()["status"] == "succeeded"
    events = done.events().records
    assert [e["event"] for e in events].count("trainer_actor") == 2
    assert any(e["event"] == "resumed" and e["from_step"] >= 2 for e in events)
    steps = [m["step"] for m in done.metrics().records if m.get("stage") is None]
    assert steps == [0, 1, 2, 3]  # the steps after the checkpoint were cut and trained again once


def test_a_screen_on_ray_workers_writes_what_one_process_writes(tmp_path: Path) -> None:
    from reprorl.config.screen import ScreenSpec
    from reprorl.orchestrate.jobs.screen import screen
    from reprorl.store.rollouts import find_parts

    store = tiny_training_store(tmp_path)
    spec = ScreenSpec(
        taskset=store.pin_newest("calc-eval"),
        policy=store.pin_newest("tiny"),
        k=2,
        chunk=8,
        max_tokens=12,
        max_turns=2,
    )
    here, local = asyncio.run(screen(store, spec))
    there, remote = asyncio.run(screen(store, spec, ray="local", workers=2))
    (event,) = [e for e in there.events().records if e.get("event") == "screen_workers"]
    assert len({w["pid"] for w in event["workers"]} | {os.getpid()}) == 3
    assert [t.to_json() for t in remote.tasks] == [t.to_json() for t in local.tasks]
    # The same episodes: every token, logprob and reward (timings aside).
    assert _episodes(there) == _episodes(here)
    assert [s for _, s, _ in find_parts(there.path)] == [s for _, s, _ in find_parts(here.path)]


def _episodes(record: RunRecord) -> list[Any]:
    return sorted(
        (
            t.rollout_id.split("/", 1)[1],
            [(x.token_ids, x.logprobs, x.text) for x in t.turns],
            t.reward.model_dump() if t.reward else None,
            t.termination,
        )
        for t in RolloutStore(record).trajectories()
    )
