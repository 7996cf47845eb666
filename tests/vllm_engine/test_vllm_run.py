"""LoRA runs whose rollouts a real vLLM server (the CPU build) samples.

Each step's adapter is loaded under its version's name and every rollout names the version that
sampled it; asynchronous training keeps its staleness bound; a vLLM server killed mid-run is replaced
and the run finishes; vLLM-sampled rollouts replay in recorded mode from their recorded tokens."""

from __future__ import annotations

import asyncio
import json
import os
import signal
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


def test_asynchronous_training_on_vllm_keeps_its_staleness_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = {"source": "arrival", "max_staleness": 2}
    record = train(tmp_path, capsys, model={"vllm": ENGINE}, learning={"steps": 4, "pipeline": pipeline})
    rollouts = [t for t in RolloutStore(record).trajectories("split = 'train' AND NOT retried")]
    loaded = {e["adapter"] for e in events(record, "engine_loaded")}
    assert rollouts and all(t.sampler["kind"] == "vllm" and t.policy_version in loaded for t in rollouts)
    # Each group was trained within two updates of the version that sampled it: `batch_assembled`
    # names, per step, each group taken and the version (update count) it was sampled from.
    lags = {
        g["group_id"]: e["step"] - g["version"]
        for e in events(record, "batch_assembled")
        for g in e["groups"]
    }
    assert {t.group_id for t in rollouts} == set(lags)
    assert min(lags.values()) >= 0 and max(lags.values()) <= 2
    assert max(lags.values()) >= 1  # and it was asynchronous: some group trained on an older version
    steps = [m for m in record.metrics().records if m.get("stage") is None and "staleness_max" in m]
    assert len(steps) == 4 and all(0 <= m["staleness_max"] <= 2 for m in steps)
    # Versions beyond the window were unloaded: no server held more than it may.
    assert all(len(e["served"]["0"]) <= 1 + 4 for e in events(record, "engine_loaded"))


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


def test_a_vllm_server_killed_mid_run_is_replaced_and_the_run_finishes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
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
    record = train(tmp_path, capsys, model={"vllm": ENGINE}, learning={"steps": 4})
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
