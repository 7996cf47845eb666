"""`reprorl run` on the tiny model: warm start, policy-gradient steps, records, metrics and the adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_support import tiny_training_store

from reprorl.cli.main import main
from reprorl.orchestrate.run.rollouts import load_taskset
from reprorl.policy import load_base, tiny_model
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import Split, TaskSet

SPEC = """
name = "tiny-train"
seed = 5
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
steps = 2
sft_steps = 3
lr = 1e-3
group_size = 3
tasks_per_step = 2
max_tokens = 16
max_turns = 2
drop_zero_variance_groups = false
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
thresholds = { success = 0.5, tool_calls_mean = 0.0 }
"""


def test_a_run_warm_starts_trains_and_records_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tiny_training_store(tmp_path)
    (tmp_path / "spec.toml").write_text(SPEC)
    assert main(["--home", str(tmp_path / "home"), "run", str(tmp_path / "spec.toml")]) == 0

    (run_dir,) = [p for p in (tmp_path / "home" / "runs").iterdir() if not p.name.startswith(".")]
    record = RunRecord(store, run_dir.name)
    assert record.status()["status"] == "succeeded"
    # Where training ran, and under what determinism, is on the record.
    (device,) = [e for e in record.events().records if e.get("event") == "trainer_device"]
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert device["device"] == expected and device["master_dtype"] == "float32" and device["deterministic"]
    assert device["compute_dtype"] == "bfloat16" and device["torch"] == torch.__version__
    assert device["matmul_flops_per_s"] > 1e9  # the update's bound, measured where it trained
    metrics = record.metrics().records
    sft = [m for m in metrics if m.get("stage") == "sft"]
    assert len(sft) == 3 and sft[-1]["sft_loss"] < sft[0]["sft_loss"]  # the warm start learned
    steps = [m for m in metrics if m.get("stage") is None]
    assert [m["step"] for m in steps] == [0, 1]
    for m in steps:
        for key in (
            "reward_mean",
            "zero_variance_share",
            "rollout_s",
            "train_s",
            "rollout_cpu_s",
            "tools/failure_rate",
            "train/entropy",
            "train/kl_k3",
            "train/mismatch_k3",
            "train/grad_norm",
            "train/clip_frac_high",
            "truncation_rate",
            "prompt_tokens",
        ):
            assert key in m, key
    # Eval points on the frozen suite before the first step and after the last, with intervals.
    evals = [m for m in metrics if m.get("stage") == "eval"]
    assert [m["step"] for m in evals] == [0, 2]
    for m in evals:
        assert m["eval/calc-eval/rollouts"] == 32
        # Acceptance: each declared threshold checked on the point, and all of them together.
        assert m["eval/calc-eval/accept/tool_calls_mean"] == 1.0
        passed = m["eval/calc-eval/success"] >= 0.5
        assert m["eval/calc-eval/accept/success"] == m["eval/calc-eval/accepted"] == float(passed)
        assert (
            m["eval/calc-eval/success_low"] <= m["eval/calc-eval/success"] <= m["eval/calc-eval/success_high"]
        )
    assert evals[0]["policy_version"] == steps[0]["policy_version"] != evals[1]["policy_version"]
    # Every sample names the adapter state it came from; the update between steps changed it.
    versions = [m["policy_version"] for m in steps]
    assert all(v.startswith("adapter:sha256:") for v in versions)
    # A group without reward variance teaches nothing (fresh Adam moments: no step at all); one with
    # variance moves the weights.
    for m, after in zip(steps, [*versions[1:], evals[1]["policy_version"]], strict=True):
        moved = m["train/grad_norm"] > 0
        assert (m["policy_version"] != after) == moved, m
    assert any(m["train/grad_norm"] > 0 for m in steps)
    rollouts = RolloutStore(record)
    assert rollouts.count("split = 'train'") == 12
    assert rollouts.count("split = 'eval'") == 64
    assert rollouts.count("step = 1 AND policy_version = " + repr(versions[1])) == 6
    # The offline eval of the same weights and seed gives the in-loop numbers, to the last digit:
    # the final weights (the last eval point) and a checkpoint's (step 0, after the warm start).
    for args, point in (([], evals[1]), (["--step", "0"], evals[0])):
        capsys.readouterr()
        code = main(
            [
                "--home",
                str(tmp_path / "home"),
                "eval",
                run_dir.name,
                "--suite",
                "calc-eval@v1",
                "--json",
                *args,
            ]
        )
        assert code == 0
        offline = json.loads(capsys.readouterr().out)
        assert offline["policy_version"] == point["policy_version"]
        figures = offline["suites"][0]["metrics"]
        in_loop = {k.removeprefix("eval/calc-eval/"): v for k, v in point.items() if k.startswith("eval/")}
        timing = {k for k in in_loop if "latency" in k}
        assert len(in_loop) > 10 and set(figures) == set(in_loop)
        assert {k: v for k, v in figures.items() if k not in timing} == {
            k: v for k, v in in_loop.items() if k not in timing
        }
    (check,) = [e for e in record.events().records if e.get("event", "").startswith("leakage")]
    assert check["event"] == "leakage_check" and check["ok"]
    assert list(check["held_out_counts"].values()) == [32]
    saved = [e for e in record.events().records if e.get("event") == "adapter_saved"]
    assert len(saved) == 1 and saved[0]["artifact"] == "tiny-train-adapter@v1"
    assert (run_dir / "adapter" / "adapter_config.json").is_file()
    # The registered adapter says what it can be loaded onto and how it was trained.
    meta = store.resolve("tiny-train-adapter@v1").version.meta
    assert meta["base_model"] == store.resolve("tiny@v1").hash
    assert meta["adapter"]["rank"] == 4 and meta["adapter"]["targets"] == ["q_proj", "v_proj"]
    assert meta["lr"] == 1e-3 and meta["step"] == 2 and meta["run_id"] == record.run_id
    assert meta["train_taskset"] == store.resolve("calc-train@v1").hash


def test_full_fine_tuning_trains_every_weight_and_saves_a_loadable_model(tmp_path: Path) -> None:
    store = tiny_training_store(tmp_path)
    spec = SPEC.replace(
        'adapter = { kind = "lora", rank = 4, alpha = 8.0, targets = ["q_proj", "v_proj"] }',
        'adapter = { kind = "full" }',
    )
    spec = spec.replace("steps = 2\nsft_steps = 3", "steps = 1\nsft_steps = 2")
    (tmp_path / "spec.toml").write_text(spec.replace('name = "tiny-train"', 'name = "tiny-full"'))
    assert main(["--home", str(tmp_path / "home"), "run", str(tmp_path / "spec.toml")]) == 0

    version = store.resolve("tiny-full-adapter@v1")
    assert version.version is not None and version.version.meta["adapter"] == {"kind": "full"}
    trained = load_base("tiny-full-adapter@v1", store=store)
    before = tiny_model(0).model.state_dict()
    after = trained.model.state_dict()
    changed = [n for n, t in before.items() if not torch.equal(t, after[n])]
    # Every kind of weight moved: embeddings, attention, MLP and norms.
    for part in ("embed_tokens", "q_proj", "down_proj", "input_layernorm"):
        assert any(part in n for n in changed), part
    metrics = [m for m in RunRecord(store, store.registry.runs()[0].run_id).metrics().records]
    step = next(m for m in metrics if m.get("stage") is None)
    assert step["policy_version"].startswith("weights:sha256:") and "train/kl_k3" in step


def test_a_run_continues_from_a_registered_adapter(tmp_path: Path) -> None:
    store = tiny_training_store(tmp_path)
    first = SPEC.replace("steps = 2\nsft_steps = 3", "steps = 1\nsft_steps = 2")
    (tmp_path / "first.toml").write_text(first)
    home = ["--home", str(tmp_path / "home")]
    assert main([*home, "run", str(tmp_path / "first.toml")]) == 0
    final = [m for m in _records(store) if m.get("stage") == "eval"][-1]["policy_version"]

    second = first.replace('base = "tiny"', 'base = "tiny"\ninit_adapter = "tiny-train-adapter"')
    (tmp_path / "second.toml").write_text(second.replace("sft_steps = 2", "sft_steps = 0"))
    assert main([*home, "run", str(tmp_path / "second.toml")]) == 0
    # The second run's first samples come from exactly the weights the first run ended with.
    assert next(m for m in _records(store) if m.get("stage") == "eval")["policy_version"] == final

    (tmp_path / "third.toml").write_text(second.replace("rank = 4", "rank = 8"))
    assert main([*home, "run", str(tmp_path / "third.toml")]) == 2


def _records(store: Store) -> list[dict[str, object]]:
    newest = store.registry.runs()[0].run_id
    return RunRecord(store, newest).metrics().records


def test_a_leaked_eval_task_stops_the_run_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A train task copied into the eval suite under a new id is caught before step 0; allowing
    leakage in the spec runs anyway and records the report."""
    store = tiny_training_store(tmp_path)
    train, suite = load_taskset(store, "calc-train@v1"), load_taskset(store, "calc-eval@v1")
    copied = train.tasks[5].model_copy(update={"id": "calc-eval-renamed", "split": Split.EVAL})
    leaky = TaskSet(name="calc-leaky", tasks=(*suite.tasks, copied))
    store.add_bytes("calc-leaky", leaky.to_jsonl(), kind="taskset")
    spec = SPEC.replace('suites = ["calc-eval"]', 'suites = ["calc-leaky"]')
    spec = spec.replace("steps = 2\nsft_steps = 3", "steps = 1\nsft_steps = 0")
    (tmp_path / "spec.toml").write_text(spec)
    home = ["--home", str(tmp_path / "home")]

    assert main([*home, "run", str(tmp_path / "spec.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "evaluation.suites" in err and f"calc-eval-renamed = {train.tasks[5].id} (exact)" in err
    runs = tmp_path / "home" / "runs"
    assert not runs.exists() or not [p for p in runs.iterdir() if not p.name.startswith(".")]

    (tmp_path / "spec.toml").write_text(spec + "allow_leakage = true\n")
    assert main([*home, "run", str(tmp_path / "spec.toml")]) == 0
    (run_dir,) = [p for p in runs.iterdir() if not p.name.startswith(".")]
    (event,) = [
        e for e in RunRecord(store, run_dir.name).events().records if e["event"].startswith("leakage")
    ]
    assert event["event"] == "leakage_allowed" and event["leak_count"] == 1
    assert event["leaks"][0]["held_id"] == "calc-eval-renamed"
