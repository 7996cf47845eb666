"""LoRA runs whose rollouts a real vLLM server (the CPU build) samples.

Each step's adapter is loaded under its version's name and every rollout names the version that
sampled it; asynchronous training keeps its staleness bound; a vLLM server killed mid-run is replaced
and the run finishes; vLLM-sampled rollouts replay in recorded mode from their recorded tokens."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from cli_support import Cli, run_ids, tiny_spec, tiny_training_store

from reprorl.orchestrate.run.kept_versions import kept_lines
from reprorl.store import RunRecord, find_run
from reprorl.store.rollout_query import RolloutStore

ENGINE = {"max_model_len": 2048, "startup_timeout_s": 300}


def train(tmp_path: Path, capsys: pytest.CaptureFixture[str], **sections: dict[str, Any]) -> RunRecord:
    store = tiny_training_store(tmp_path)
    spec = tiny_spec("vllm-run", **sections)
    (tmp_path / "spec.toml").write_text(spec)
    code, _, err = Cli(tmp_path / "home", capsys)("run", str(tmp_path / "spec.toml"))
    assert code == 0, err
    (run_id,) = run_ids(tmp_path / "home")
    return find_run(store, run_id)


def events(record: RunRecord, kind: str) -> list[dict[str, Any]]:
    return [e for e in record.events().records if e.get("event") == kind]


def kept_versions(record: RunRecord) -> dict[str, int]:
    """Each version the run sampled from, by the step it was first published at."""
    return {version: int(str(line["first_step"])) for version, line in kept_lines(record).items()}


def test_every_rollout_is_sampled_by_vllm_from_the_adapter_of_its_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = train(tmp_path, capsys, model={"vllm": ENGINE}, learning={"steps": 3})
    rollouts = list(RolloutStore(record).trajectories())
    assert rollouts and all(t.sampler["kind"] == "vllm" and t.sampler["engine_version"] for t in rollouts)
    # The server reprorl started reports logprobs after temperature, as the probe found and recorded.
    assert all(t.sampler["logprobs"] == "processed" for t in rollouts)
    assert all(t.sampler["model"] == t.policy_version for t in rollouts)  # the adapter's name is its version
    by_step: dict[int, set[str]] = defaultdict(set)
    for t in rollouts:
        if t.split == "train":
            by_step[t.step].add(t.policy_version)
    kept = kept_versions(record)
    # One version per step, each a new adapter: the weights changed every step and vLLM got them.
    assert sorted(by_step) == [0, 1, 2] and all(len(v) == 1 for v in by_step.values())
    assert [kept[next(iter(by_step[s]))] for s in (0, 1, 2)] == [0, 1, 2]
    # vLLM's own /v1/models, asked after each load, served the version sampled at that step.
    loaded = events(record, "engine_loaded")
    for (version,) in (tuple(by_step[s]) for s in (0, 1, 2)):
        assert any(e["adapter"] == version and version in e["served"]["0"] for e in loaded)
    steps = [m for m in record.metrics().records if m.get("stage") is None and "train/grad_norm" in m]
    assert len(steps) == 3 and any(m["train/grad_norm"] > 0 for m in steps)
    assert all(abs(m["train/mismatch_k3"]) < 1e-3 for m in steps if "train/mismatch_k3" in m)
    # The runs' sampled tokens carry vLLM's own logprobs, one per token.
    turns = [turn for t in rollouts for turn in t.turns if turn.token_ids]
    assert turns and all(len(turn.logprobs) == len(turn.token_ids) for turn in turns)

    replayed = replay_recorded(record, 20)
    assert replayed["identical"] == 20, replayed

    # Live: the run's engine starts again on its saved base, each turn's adapter (checked against
    # the hash the run recorded) is asked anew with the recorded seed, and the rate is printed.
    code, out, err = Cli(tmp_path / "home", capsys)(
        "replay", "--mode", "live", "--run", record.run_id, "--random", "3"
    )
    assert code in (0, 1), err
    each = re.findall(r"token agreement (\d+)/(\d+)", out)
    assert len(each) == 4, out  # one per rollout, and the three together
    agreed, compared = map(int, each[-1])
    assert compared == sum(int(b) for _, b in each[:3]) and 0.5 * compared <= agreed <= compared, out
    assert not vllm_children(record.path), "the replay's vLLM server outlived it"


CLI = "import sys; from reprorl.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _killed_after_checkpoint(home: Path, spec: Path, step: int) -> str:
    """Start `reprorl run spec` in a process of its own, SIGKILL it once the checkpoint of `step`
    is on disk, and return the run's id."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "--home", str(home), "run", str(spec)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        if any(home.glob(f"runs/*/checkpoints/step-{step:06d}")):
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    (run_id,) = run_ids(home)
    return run_id


def test_full_fine_tuning_reloads_each_versions_weights_and_a_killed_run_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tiny_training_store(tmp_path)
    home = tmp_path / "home"
    spec = tiny_spec("vllm-full", model={"vllm": ENGINE, "adapter": {"kind": "full"}}, learning={"steps": 3})
    (tmp_path / "spec.toml").write_text(spec)
    run_id = _killed_after_checkpoint(home, tmp_path / "spec.toml", 1)
    record = find_run(store, run_id)
    deadline = time.monotonic() + 30
    while vllm_children(record.path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not vllm_children(record.path), "the vLLM server outlived its killed run"
    code, _, err = Cli(home, capsys)("run", "--resume", run_id)
    assert code == 0, err
    assert record.status()["status"] == "succeeded" and events(record, "resumed")
    assert len(events(record, "engine_started")) == 2  # the resume started its own server
    rollouts = list(RolloutStore(record).trajectories("NOT retried"))
    versions = {t.step: t.policy_version for t in rollouts if t.split == "train"}
    assert sorted(versions) == [0, 1, 2] and len(set(versions.values())) == 3  # the weights changed
    assert all(v.startswith("weights:") for v in versions.values())
    # Every rollout was answered by a server that had reloaded the weights of its version.
    assert all(t.sampler["kind"] == "vllm" and t.sampler["weights"] == t.policy_version for t in rollouts)
    reloaded = {e["weights"] for e in events(record, "engine_reloaded")}
    assert set(versions.values()) <= reloaded
    # Only the weights served last are kept for the servers (a full model per step would pile up).
    assert len(list((record.path / "engine" / "weights").iterdir())) == 1
    steps = [m for m in record.metrics().records if m.get("stage") is None and "train/grad_norm" in m]
    assert sorted(m["step"] for m in steps)[-1] == 2 and any(m["train/grad_norm"] > 0 for m in steps)
    assert all(abs(m["train/mismatch_k3"]) < 1e-2 for m in steps if "train/mismatch_k3" in m)


def replay_recorded(record: RunRecord, count: int) -> dict[str, Any]:
    """`replay --mode recorded` of `count` rollouts of the run (train and eval); what came out."""
    from reprorl.orchestrate.jobs.replay import Replayer

    ids = sorted(t.rollout_id for t in RolloutStore(record).trajectories("NOT retried"))[:count]
    assert len(ids) == count
    replayer = Replayer(record.store)

    async def all_of() -> list[Any]:
        return [await replayer.replay(i, mode="recorded") for i in ids]

    reports = asyncio.run(all_of())
    return {"identical": sum(r.identical for r in reports), "first": [r.first for r in reports if r.first]}


def vllm_children(run_folder: Path) -> list[int]:
    """Pids of the vLLM API servers serving `run_folder`'s base model."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in argv and str(run_folder).encode() in b" ".join(argv):
            found.append(int(proc.name))
    return found


def test_asynchronous_training_on_vllm_keeps_its_bound_and_outlives_a_killed_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One run for two promises (a vLLM start is a minute here): asynchronous training with
    staleness 2 keeps its bound, and a server killed mid-run is replaced while the run goes on."""
    home = tmp_path / "home"
    killed: list[int] = []

    def kill_after_first_step() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not killed:
            for events_file in home.glob("runs/*/events.jsonl"):
                lines = [json.loads(line)["rec"] for line in events_file.read_text().splitlines() if line]
                if any(e["event"] == "rollouts_written" and e["step"] >= 1 for e in lines):
                    for pid in vllm_children(events_file.parent):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
            time.sleep(0.2)

    killer = threading.Thread(target=kill_after_first_step, daemon=True)
    killer.start()
    pipeline = {"source": "arrival", "max_staleness": 2}
    record = train(tmp_path, capsys, model={"vllm": ENGINE}, learning={"steps": 4, "pipeline": pipeline})
    killer.join(5)
    assert killed, "the server was never killed"
    down, replaced = events(record, "vllm_server_down"), events(record, "vllm_server_replaced")
    assert down and replaced and len(replaced) == len(down)
    # The replacement served the versions after it (vLLM's /v1/models says so), and the run went on.
    after = [e for e in events(record, "engine_loaded") if e["time"] > replaced[0]["time"]]
    assert after and all(e["adapter"] in e["served"]["0"] for e in after)
    rollouts = list(RolloutStore(record).trajectories("split = 'train' AND NOT retried"))
    assert sorted({t.step for t in rollouts}) == [0, 1, 2, 3]
    assert all(t.termination != "infra_error" for t in rollouts)
    assert record.status()["status"] == "succeeded"
    check_staleness(record, steps=4, bound=2)


def check_staleness(record: RunRecord, *, steps: int, bound: int) -> None:
    rollouts = [t for t in RolloutStore(record).trajectories("split = 'train' AND NOT retried")]
    loaded = {e["adapter"] for e in events(record, "engine_loaded")}
    assert rollouts and all(t.sampler["kind"] == "vllm" and t.policy_version in loaded for t in rollouts)
    # Each group was trained within `bound` updates of the version that sampled it: `batch_assembled`
    # names, per step, each group taken and the version (update count) it was sampled from.
    lags = {
        g["group_id"]: e["step"] - g["version"]
        for e in events(record, "batch_assembled")
        for g in e["groups"]
    }
    assert {t.group_id for t in rollouts} == set(lags)
    assert min(lags.values()) >= 0 and max(lags.values()) <= bound
    assert max(lags.values()) >= 1  # and it was asynchronous: some group trained on an older version
    lines = [m for m in record.metrics().records if m.get("stage") is None and "staleness_max" in m]
    assert len(lines) == steps and all(0 <= m["staleness_max"] <= bound for m in lines)
    # Versions beyond the window were unloaded: no server held more than it may.
    assert all(len(e["served"].get("0", [])) <= 1 + bound + 2 for e in events(record, "engine_loaded"))


def test_on_ray_the_servers_are_actors_and_the_rollout_workers_ask_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ray = pytest.importorskip("ray")
    store = tiny_training_store(tmp_path)
    (tmp_path / "spec.toml").write_text(tiny_spec("vllm-ray", model={"vllm": ENGINE}, learning={"steps": 2}))
    try:
        code, _, err = Cli(tmp_path / "home", capsys)("run", str(tmp_path / "spec.toml"), "--ray", "local")
    finally:
        if ray.is_initialized():
            ray.shutdown()
    assert code == 0, err
    (run_id,) = run_ids(tmp_path / "home")
    record = find_run(store, run_id)
    (trainer,) = events(record, "trainer_actor")
    (workers,) = events(record, "rollout_workers")
    (started,) = events(record, "engine_started")
    # Three kinds of process, each placed by Ray: the trainer, a rollout worker, a vLLM server's actor.
    (placed,) = started["placed"]
    assert placed["node_id"] and placed["url"].startswith("http://127.0.0.1:")
    pids = {trainer["pid"], placed["pid"], *(w["pid"] for w in workers["workers"])}
    assert len(pids) == 3 and os.getpid() not in pids
    # The worker sampled every rollout through the server, from the adapter of its step.
    rollouts = list(RolloutStore(record).trajectories())
    assert rollouts and all(
        t.sampler["kind"] == "vllm" and t.sampler["model"] == t.policy_version for t in rollouts
    )
    assert {t.step for t in rollouts if t.split == "train"} == {0, 1}
    assert len({t.policy_version for t in rollouts if t.split == "train"}) == 2
    assert not vllm_children(record.path), "the server outlived its actor"
