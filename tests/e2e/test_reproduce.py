"""`reprorl reproduce`: a tiny run re-run from its records matches exactly; a changed record is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import tiny_training_store

from reprorl.cli.main import main
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
