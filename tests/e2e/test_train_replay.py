"""Every rollout of a training run replays from the weights it was sampled from: the run keeps each
policy version it published, and replay opens exactly those, checked against the version's hash."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_support import Cli, run_ids, tiny_training_store

from reprorl.store import RunRecord, Store, read_log
from reprorl.store.rollout_query import RolloutStore
from reprorl.store.runs import VERSIONS_FILE

SPEC = """
name = "tiny-replay"
seed = 11
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
steps = 20
sft_steps = 2
lr = 5e-3
group_size = 2
tasks_per_step = 2
max_tokens = 8
max_turns = 2
drop_zero_variance_groups = false
checkpoint_every = 5
keep_checkpoints = 2
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
every_steps = 10
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp_path = tmp_path_factory.mktemp("replay")
    tiny_training_store(tmp_path)
    (tmp_path / "spec.toml").write_text(SPEC)
    from reprorl.cli.main import main

    home = tmp_path / "home"
    assert main(["--home", str(home), "run", str(tmp_path / "spec.toml")]) == 0
    (run_id,) = run_ids(home)
    return home, run_id


def _ids(home: Path, run_id: str, where: str) -> list[str]:
    rows = RolloutStore(RunRecord(Store(home), run_id)).query(where, columns=["rollout_id"]).to_pylist()
    return sorted(str(r["rollout_id"]) for r in rows)


def test_the_earliest_and_the_last_steps_rollouts_replay_bit_for_bit(
    trained: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    home, run_id = trained
    cli = Cli(home, capsys)
    record = RunRecord(Store(home), run_id)
    first, last = _ids(home, run_id, "step = 0 AND split = 'train'"), _ids(home, run_id, "step = 19")
    evals = _ids(home, run_id, "split = 'eval' AND step = 20")
    assert first and last and evals
    rollouts = RolloutStore(record)
    version_of = {i: rollouts.get(i).policy_version for i in (first[0], last[0], evals[0])}
    assert len(set(version_of.values())) == 3  # warm start, 19 updates, 20 updates: three weights
    assert all(v.startswith("adapter:sha256:") for v in version_of.values())

    kept = read_log(record.path / VERSIONS_FILE).records
    rows = rollouts.query("TRUE", columns=["policy_version"]).to_pylist()
    sampled = {str(r["policy_version"]) for r in rows}
    assert len(kept) == len({k["policy_version"] for k in kept})  # each version kept once
    assert {k["policy_version"] for k in kept} == sampled  # every version any rollout was sampled from
    assert len(sampled) >= 15 and all(k["tensors"] and k["bytes"] > 0 for k in kept)

    reports = cli.ok_json("replay", first[0], last[0], evals[0], "--mode", "recorded")
    assert [r["identical"] for r in reports] == [True, True, True], reports
    assert all(r["tokens"] > 0 for r in reports)
    (live,) = [cli.ok_json("replay", first[-1], "--mode", "live")]
    assert live["identical"], live
    # Every recorded token was drawn again: the agreement a live replay reports is all of them.
    assert live["agreement"] == 1.0 and live["tokens_agreed"] == live["tokens_compared"] == live["tokens"] > 0


def test_replay_refuses_in_one_line_when_the_weights_are_gone_or_altered(
    trained: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    home, run_id = trained
    cli = Cli(home, capsys)
    store = Store(home)
    record = RunRecord(store, run_id)
    target = _ids(home, run_id, "step = 3 AND split = 'train'")[0]
    version = RolloutStore(record).get(target).policy_version
    (line,) = [k for k in read_log(record.path / VERSIONS_FILE).records if k["policy_version"] == version]
    blob = store.blobs.path_of(str(line["tensors"]))
    data = blob.read_bytes()
    blob.chmod(0o644)
    try:
        blob.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        error = cli.error("replay", target, "--mode", "recorded")
        assert version in error or str(line["tensors"]) in error, error
        blob.unlink()
        error = cli.error("replay", target, "--mode", "recorded")
        assert "no longer in this store" in error and version in error, error
    finally:
        blob.write_bytes(data)
        blob.chmod(0o444)
    assert cli.ok_json("replay", target, "--mode", "recorded")["identical"]
    print(json.dumps({"bytes_each": line["bytes"]}))


def test_an_async_runs_rollouts_replay_from_the_version_that_sampled_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny_training_store(tmp_path)
    (tmp_path / "spec.toml").write_text(SPEC.replace("steps = 20", "steps = 4"))
    home = tmp_path / "home"
    cli = Cli(home, capsys)
    code, _, err = cli("run", str(tmp_path / "spec.toml"), "learning.pipeline.max_staleness=1")
    assert code == 0, err
    (run_id,) = run_ids(home)
    rollouts = RolloutStore(RunRecord(Store(home), run_id))
    targets = [_ids(home, run_id, "step = 0 AND split = 'train'")[0], _ids(home, run_id, "step = 3")[0]]
    targets.append(_ids(home, run_id, "step = 4 AND split = 'eval'")[0])  # after the last update
    assert len({rollouts.get(t).policy_version for t in targets}) >= 2
    reports = cli.ok_json("replay", *targets, "--mode", "recorded")
    assert [r["identical"] for r in reports] == [True, True, True], reports


def test_a_full_fine_tuning_run_replays_its_checkpointed_versions_and_names_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny_training_store(tmp_path)
    spec = SPEC.replace(
        'adapter = { kind = "lora", rank = 4, alpha = 8.0, targets = ["q_proj", "v_proj"] }', ""
    )
    spec = spec.replace("steps = 20", "steps = 4").replace("checkpoint_every = 5", "checkpoint_every = 1")
    spec = spec.replace("group_size = 2", "group_size = 4")
    (tmp_path / "spec.toml").write_text(spec.replace("[model]", '[model]\nadapter = { kind = "full" }'))
    home = tmp_path / "home"
    cli = Cli(home, capsys)
    code, _, err = cli("run", str(tmp_path / "spec.toml"), "learning.sft_steps=0")
    assert code == 0, err
    (run_id,) = run_ids(home)
    record = RunRecord(Store(home), run_id)
    kept = read_log(record.path / VERSIONS_FILE).records
    assert kept and all(k["tensors"] is None and "checkpoints" in k["why"] for k in kept)
    checkpointed = sorted(p.name for p in (record.path / "checkpoints").iterdir())
    assert checkpointed == ["step-000002", "step-000003"]  # keep_checkpoints = 2 pruned the rest
    held = _ids(home, run_id, "step = 3 AND split = 'train'")[0]
    assert cli.ok_json("replay", held, "--mode", "recorded")["identical"]
    gone = _ids(home, run_id, "step = 0 AND split = 'train'")[0]
    rollouts = RolloutStore(record)
    assert rollouts.get(gone).policy_version != rollouts.get(held).policy_version  # the weights moved
    error = cli.error("replay", gone, "--mode", "recorded")
    assert "full fine-tuning keeps every weight only in its checkpoints" in error, error
    assert "step-000002" in error, error  # and it names the checkpoints that are kept


def test_a_compacted_run_replays_the_same(
    trained: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original, run_id = trained
    home = tmp_path / "home"
    shutil.copytree(original, home)
    cli = Cli(home, capsys)
    picked = [*_ids(home, run_id, "step = 0 AND split = 'train'")[:1], *_ids(home, run_id, "step = 19")[:1]]
    before = cli.ok_json("replay", *picked, "--mode", "recorded")
    done = cli.ok_json("runs", "compact", run_id)
    assert done["parts_after"] < done["parts_before"]
    after = cli.ok_json("replay", *picked, "--mode", "recorded")
    assert [r["identical"] for r in after] == [True, True] and after == before
    # A failed run is resumable, but not once compacted: a resume rewinds over per-step parts.
    RunRecord(Store(home), run_id).set_status("failed")
    assert "compacted: it cannot be resumed" in cli.error("run", "--resume", run_id)
