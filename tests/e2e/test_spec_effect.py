"""Spec fields that change what the model sees take effect, and the record shows it."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import Cli, run_ids, tiny_training_store

from reprorl.policy.tiny_tokenizer import CHAT_TEMPLATE
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore

SPEC = """
name = "tiny-effect"
seed = 4
[model]
owner = "t@x"
base = "tiny"
adapter = {{ kind = "lora", rank = 4, alpha = 8.0, targets = ["q_proj", "v_proj"] }}
{model_extra}
[data]
owner = "t@x"
train = "calc-train"
reward_weights = {{ outcome = 1.0, valid_calls = 1.0 }}
[learning]
owner = "t@x"
steps = 1
lr = 1e-3
group_size = 2
tasks_per_step = 2
max_tokens = 8
max_turns = 1
drop_zero_variance_groups = false
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
every_steps = 10
"""
# The same conversation, with words the tiny vocabulary knows put before every answer.
PRIMED = CHAT_TEMPLATE.replace("'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\nThe answer is '")


def _run(cli: Cli, tmp_path: Path, model_extra: str) -> RunRecord:
    (tmp_path / "spec.toml").write_text(SPEC.format(model_extra=model_extra))
    before = set(run_ids(cli.home))
    code, _, err = cli("run", str(tmp_path / "spec.toml"))
    assert code == 0, err
    (run_id,) = set(run_ids(cli.home)) - before
    return RunRecord(Store(cli.home), run_id)


def test_model_chat_template_renders_every_prompt_and_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert PRIMED != CHAT_TEMPLATE
    tiny_training_store(tmp_path)
    cli = Cli(tmp_path / "home", capsys)
    (tmp_path / "primed.jinja").write_text(PRIMED)
    cli.ok_json("artifacts", "add", "primed", str(tmp_path / "primed.jinja"))
    own = _run(cli, tmp_path, "")
    primed = _run(cli, tmp_path, 'chat_template = "primed@v1"')
    assert primed.spec()["model"]["chat_template"].startswith("primed@sha256:")

    def first(record: RunRecord) -> tuple[str, tuple[int, ...]]:
        rollouts = RolloutStore(record)
        (row,) = rollouts.query(
            "step = 0 AND split = 'train' AND member = 0", columns=["rollout_id"]
        ).to_pylist()[:1]
        trajectory = rollouts.get(str(row["rollout_id"]))
        return trajectory.prompt_template_hash, tuple(trajectory.turns[0].prompt_token_ids)

    (own_hash, own_prompt), (primed_hash, primed_prompt) = first(own), first(primed)
    assert own_hash != primed_hash
    assert primed_prompt != own_prompt and len(primed_prompt) > len(own_prompt)
    target = (
        RolloutStore(primed).query("split = 'train'", columns=["rollout_id"]).to_pylist()[0]["rollout_id"]
    )
    assert cli.ok_json("replay", str(target), "--mode", "recorded")["identical"]


def test_a_chat_template_that_is_not_text_is_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny_training_store(tmp_path)
    cli = Cli(tmp_path / "home", capsys)
    (tmp_path / "bad.bin").write_bytes(b"\xff\xfe\x00binary")
    cli.ok_json("artifacts", "add", "bad", str(tmp_path / "bad.bin"))
    (tmp_path / "spec.toml").write_text(SPEC.format(model_extra='chat_template = "bad@v1"'))
    error = cli.error("run", str(tmp_path / "spec.toml"))
    assert "model.chat_template" in error and "UTF-8" in error, error
    assert run_ids(cli.home) == []  # refused before any record was written


@pytest.mark.parametrize(
    ("cap", "field"),
    [
        ("max_tokens = 1", "budget.max_tokens"),
        ("max_wall_s = 0.001", "budget.max_wall_s"),
        ("max_usd = 1e-9\nprices = { completion_usd_per_mtok = 1.0 }", "budget.max_usd"),
    ],
)
def test_a_budget_cap_stops_the_run_once_it_is_spent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cap: str, field: str
) -> None:
    tiny_training_store(tmp_path)
    cli = Cli(tmp_path / "home", capsys)
    spec = SPEC.format(model_extra="").replace("steps = 1\n", "steps = 3\n") + f"[budget]\n{cap}\n"
    (tmp_path / "spec.toml").write_text(spec)
    code, _, err = cli("run", str(tmp_path / "spec.toml"))
    assert code == 0, err
    (run_id,) = run_ids(cli.home)
    record = RunRecord(Store(cli.home), run_id)
    status = record.status()
    assert status["status"] == "stopped" and field in status["reason"], status
    steps = [m["step"] for m in record.metrics().records if m.get("stage") is None]
    assert steps == [0]  # the step that spent the cap is kept; none after it
    (event,) = [e for e in record.events().records if e.get("event") == "stopped_by_rule"]
    assert event["rules"] == [field] and event["step"] == 1


def test_training_refuses_a_remote_inference_server_it_could_not_send_weights_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny_training_store(tmp_path)
    cli = Cli(tmp_path / "home", capsys)
    extra = 'inference = { url = "http://127.0.0.1:9/v1", model = "m" }'
    (tmp_path / "spec.toml").write_text(SPEC.format(model_extra=extra))
    error = cli.error("run", str(tmp_path / "spec.toml"))
    assert "model.inference" in error, error
    assert run_ids(cli.home) == []
