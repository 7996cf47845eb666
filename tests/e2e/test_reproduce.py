"""`reprorl reproduce`: a tiny run re-run from its records matches exactly; a changed record is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import tiny_training_store

from reprorl.cli.main import main
from reprorl.hashing import sha256_hex
from reprorl.store import RunRecord
from reprorl.store.atomic import write_atomic
from reprorl.store.runs import checksummed_line

SPEC = """
name = "tiny-reproduce"
seed = 9
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
steps = 2
sft_steps = 2
lr = 1e-3
group_size = 3
tasks_per_step = 2
max_tokens = 12
max_turns = 2
drop_zero_variance_groups = false
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
"""


def test_a_run_reproduces_exactly_and_a_changed_record_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tiny_training_store(tmp_path)
    (tmp_path / "spec.toml").write_text(SPEC)
    home = ["--home", str(tmp_path / "home")]
    assert main([*home, "run", str(tmp_path / "spec.toml")]) == 0
    (run_id,) = [p.name for p in (tmp_path / "home" / "runs").iterdir() if not p.name.startswith(".")]
    capsys.readouterr()

    assert main([*home, "reproduce", run_id, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["matches"] and result["differences"] == []
    assert result["original"] == run_id != result["rerun"]
    assert result["adapter"]["original"] == result["adapter"]["rerun"] is not None
    lines = RunRecord(store, run_id).metrics().records
    assert result["lines_compared"] == len(lines) == 6  # 2 SFT steps, 2 eval points, 2 RL steps

    # The control: a recorded figure that the rerun cannot give back is named, and the exit is 1.
    changed = [dict(line) for line in lines]
    step = next(i for i, m in enumerate(changed) if m.get("stage") is None)
    changed[step]["reward_mean"] = changed[step]["reward_mean"] + 0.5
    write_atomic(
        tmp_path / "home" / "runs" / run_id / "metrics.jsonl", b"".join(checksummed_line(m) for m in changed)
    )
    assert main([*home, "reproduce", run_id, "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert not result["matches"]
    assert [(d["line"], d["key"]) for d in result["differences"]] == [(step, "reward_mean")]

    # A line edited without its checksum is named as damaged, and the lines after it still line up.
    edited = json.loads(checksummed_line(lines[step]))
    edited["rec"]["reward_mean"] = lines[step]["reward_mean"] + 0.5
    body = [checksummed_line(m) for m in lines]
    body[step] = (json.dumps(edited) + "\n").encode()
    write_atomic(tmp_path / "home" / "runs" / run_id / "metrics.jsonl", b"".join(body))
    assert main([*home, "reproduce", run_id, "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert [(d["line"], d["key"]) for d in result["differences"]] == [(step, "damaged line")]
    assert f"line {step + 1} is torn" in result["differences"][0]["original"]
    assert result["differences"][0]["rerun"] == "intact"


def test_a_run_recorded_at_another_commit_is_compared_with_a_warning_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tiny_training_store(tmp_path)
    (tmp_path / "spec.toml").write_text(SPEC)
    home = ["--home", str(tmp_path / "home")]
    short = ["learning.steps=1", "learning.sft_steps=0"]  # the code check needs a run, not a long one
    assert main([*home, "run", str(tmp_path / "spec.toml"), *short]) == 0
    (run_id,) = [p.name for p in (tmp_path / "home" / "runs").iterdir() if not p.name.startswith(".")]

    # The record as if it had been made at another commit: run.json edited, and its checksum with it,
    # so the record still verifies and only the commit differs.
    folder = tmp_path / "home" / "runs" / run_id
    info = json.loads((folder / "run.json").read_text())
    then = "0badc0de" * 5
    info["environment"]["code"]["cwd"] = {**(info["environment"]["code"]["cwd"] or {}), "commit": then}
    body = (json.dumps(info, indent=2, sort_keys=True) + "\n").encode()
    write_atomic(folder / "run.json", body)
    sums = json.loads((folder / "checksums.json").read_text())
    write_atomic(folder / "checksums.json", json.dumps({**sums, "run.json": sha256_hex(body)}).encode())
    RunRecord(store, run_id).verify()
    capsys.readouterr()

    assert main([*home, "reproduce", run_id]) == 0  # a different commit warns; it does not refuse
    out = capsys.readouterr().out
    (rerun_id,) = [p.name for p in folder.parent.iterdir() if p.name not in (run_id,) and p.name[0] != "."]
    now = (RunRecord(store, rerun_id).info()["environment"]["code"]["cwd"] or {}).get("commit") or "none"
    assert now != then
    assert f"warning: code commit differs: {then} then, {now} now" in out
    assert f"{rerun_id} against {run_id}: reproduced exactly (3 metric lines" in out  # 2 eval points, 1 step
