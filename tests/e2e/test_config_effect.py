"""Every leaf field of `RunSpec`, found from its schema, takes effect: changed from the base spec's value
on a tiny run, the effective config (what the component that uses it reported) changes to the new value
and agrees with the spec, and the run's records differ from the base run's. Label-only fields and the
fields training refuses are listed with why; a new field that is in none of these lists fails."""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_ids, tiny_training_store
from pydantic import BaseModel

from reprorl.cli.main import main
from reprorl.config import RunSpec
from reprorl.config.engine import VllmEngine
from reprorl.config.load import stored_spec
from reprorl.orchestrate.run.effective import EFFECTIVE_FILE, LABELS, disagreements
from reprorl.policy import save_model, tiny_model
from reprorl.policy.tiny_tokenizer import CHAT_TEMPLATE
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore

BASE = """
name = "effect"
seed = 3
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

# Fields training does not take, refused in one line (tested where named).
REFUSED = {
    "model.inference.url": "training refuses model.inference (test_spec_effect.py)",
    "model.inference.model": "training refuses model.inference (test_spec_effect.py)",
    "model.inference.timeout_s": "training refuses model.inference (test_spec_effect.py)",
    "model.inference.retries": "training refuses model.inference (test_spec_effect.py)",
}

# Fields a variant cannot set beside another it sets, covered where named.
ELSEWHERE = {
    "agent.command": "exclusive with agent.callable (the agent variant); command agents: test_agent_proxy.py",
    "learning.deterministic_cuda": "takes effect on CUDA only; the trainer_device event records it "
    "(test_train_run.py, tests/unit/trainer/test_device.py)",
    **{
        f"model.vllm.{name}": "needs vLLM servers: tests/vllm_engine (make test-vllm), "
        "tests/unit/policy/test_vllm_engine.py"
        for name in VllmEngine.model_fields
    },
}

# Each variant changes a set of fields that can go together; every other field keeps BASE's value.
JUDGE = {
    "data.judge.base_url": "http://127.0.0.1:9/v1",
    "data.judge.model": "judge-m",
    "data.judge.rubric": "Score {answer} for {task}.",
    "data.judge.max_tokens": 16,
    "data.judge.temperature": 0.5,
    "data.judge.seed": 7,
    "data.judge.timeout_s": 1.0,
    "data.judge.retries": 0,
    "data.judge.api_key_env": "REPRORL_TEST_JUDGE_KEY",
    "data.judge.prompt_usd_per_mtok": 0.5,
    "data.judge.completion_usd_per_mtok": 0.25,
    "data.judge.max_concurrency": 2,
    "data.judge.override": "a test of the config record",
    "data.reward_weights": {"outcome": 1.0, "judge": 1.0},
}
VARIANTS: dict[str, dict[str, Any]] = {
    "sync": {
        "seed": 4,
        "model.init_adapter": "effect-adapter",
        "model.sampling_dtype": "bfloat16",
        "model.train_dtype": "float32",
        "model.kept_cache_mib": 64,
        "model.chat_template": "primed",
        "data.train": "calc-train-short",
        "data.tool_output_chars": 100,
        "data.noise.latency_s": 0.01,
        "data.noise.latency_sigma": 0.5,
        "data.noise.jitter_s": 0.01,
        "data.noise.timeout_p": 0.05,
        "data.noise.transient_error_p": 0.05,
        "data.noise.stale_p": 0.05,
        "data.noise.truncate_p": 0.05,
        "data.reward_weights": {"outcome": 1.0, "valid_calls": 0.5},
        "data.family_weights": {"calculator": 1.0},
        "data.screen": {"rest_steps": 1},
        "data.verifier_timeout_s": 20.0,
        "data.max_invalid_actions": 2,
        "data.tool_permissions": ["read", "human"],
        "learning.loss": {"kind": "reinforce"},
        "learning.advantage": "grpo",
        "learning.lr": 2e-3,
        "learning.schedule": "linear",
        "learning.warmup_steps": 1,
        "learning.steps": 3,
        "learning.group_size": 3,
        "learning.tasks_per_step": 1,
        "learning.kl.estimator": "k3",
        "learning.kl.coef": 0.05,
        "learning.kl.reference": "initial",
        "learning.tis_cap": 3.0,
        "learning.checkpoint_every": 2,
        "learning.keep_checkpoints": 1,
        "learning.correction": "mis",
        "learning.temperature": 0.7,
        "learning.top_p": 0.9,
        "learning.top_k": 5,
        "learning.max_tokens": 6,
        "learning.max_turns": 2,
        "learning.episode_wall_s": 60.0,
        "learning.rollout_concurrency": 4,
        "learning.pipeline.lockstep": "group",
        "learning.drop_zero_variance_groups": True,
        "learning.sft_steps": 3,
        "learning.sft_lr": 2e-3,
        "learning.sft_schedule": "linear",
        "learning.sft_batch_size": 2,
        "learning.sft_imperfect_fraction": 0.5,
        "learning.sft_demonstrations": 3,
        "learning.sft_temperature": 0.5,
        "learning.tool_alarm_steps": 1,
        "evaluation.suites": ["calc-eval", "calc-eval-short"],
        "evaluation.every_steps": 2,
        "evaluation.samples_per_task": 2,
        "evaluation.temperature": 0.3,
        "evaluation.thresholds": {"success": 0.1},
        "evaluation.rollback": [
            {"when": "metric_below", "action": "revert", "metric": "success", "threshold": -1.0}
        ],
        "evaluation.max_unscored_share": 0.9,
        "evaluation.allow_leakage": True,
        "budget.prices.prompt_usd_per_mtok": 0.1,
        "budget.prices.completion_usd_per_mtok": 0.2,
        "budget.prices.cpu_usd_per_hour": 0.3,
        "budget.max_usd": 100.0,
        "budget.max_wall_s": 100000.0,
        "budget.max_tokens": 10000000,
    },
    "async": {
        "model.adapter": {
            "kind": "lora",
            "rank": 2,
            "alpha": 4.0,
            "dropout": 0.1,
            "targets": ["k_proj", "q_proj"],
        },
        "learning.loss": {"kind": "ppo_ewma", "ewma_decay": 0.8, "clip_low": 0.1, "clip_high": 0.2},
        "learning.pipeline.max_staleness": 1,
        "learning.kl.monitor_every": 2,
        "learning.pipeline.source": "arrival",
        "learning.pipeline.workers": 2,
    },
    "full": {
        "model.base": "tiny-b",
        "model.adapter": {"kind": "full"},
        "learning.steps": 1,
        "learning.loss": {"kind": "gspo", "clip_low": 0.01, "clip_high": 0.02},
    },
    "judge": {
        **JUDGE,
        "learning.steps": 1,
        "learning.loss": {"kind": "cispo", "clip_low": 0.5, "clip_high": 0.5},
    },
    "checklist": {
        **JUDGE,
        "data.judge.kind": "checklist",
        "data.judge.rubric": "Which of {criteria} does {answer} meet?",
        "data.judge.criteria": [
            {"text": "names the number", "weight": 2.0},
            {"text": "is brief", "weight": 1.0},
        ],
        "learning.steps": 1,
    },
    "agent": {
        "agent.owner": "t@x",
        "agent.callable": "openai_loop:agent",
        "agent.path": [str(Path(__file__).resolve().parents[1] / "agents")],
        "agent.cpu_s": 100,
        "agent.memory_bytes": 3 << 30,
        "agent.output_chars": 1000,
        "learning.steps": 1,
    },
}


behaviour: dict[str, list[dict[str, Any]]] = {}  # each run's metric lines, timings left out
records: dict[str, RunRecord] = {}


def schema_leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every leaf field of `model`, by dotted path, from the schema (a union descends into each member)."""
    out: list[str] = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        members = [a for a in (info.annotation, *_flatten(info.annotation)) if isinstance(a, type)]
        tables = [m for m in members if issubclass(m, BaseModel)]
        # A table chosen by `kind` from a registry (the loss): every built-in variant's fields.
        tables = [v for m in tables for v in (m.variants() if hasattr(m, "variants") else [m])]
        if tables and typing.get_origin(info.annotation) is not tuple:
            found = {leaf for table in tables for leaf in schema_leaves(table, f"{path}.")}
            out.extend(sorted(found))
        else:
            out.append(path)
    return out


def _flatten(annotation: Any) -> list[Any]:
    out = []
    for arg in typing.get_args(annotation):
        out.append(arg)
        out.extend(_flatten(arg))
    return out


def _covered(leaf: str) -> bool:
    changed = {path for fields in VARIANTS.values() for path in fields}
    listed = leaf in LABELS or leaf in REFUSED or leaf in ELSEWHERE
    return any(leaf == p or leaf.startswith(p + ".") for p in changed) or listed


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[dict[str, Any], RunSpec]]]:
    """The base run and one run per variant: each one's effective fields and its spec."""
    patch = pytest.MonkeyPatch()
    patch.setenv("REPRORL_TEST_JUDGE_KEY", "not-a-real-key")
    tmp = tmp_path_factory.mktemp("effect")
    tiny_training_store(tmp)
    home = tmp / "home"
    store = Store(home)
    (tmp / "primed.jinja").write_text(CHAT_TEMPLATE.replace("'<|im_start|>assistant\\n'", "'The answer is '"))
    store.add("primed", tmp / "primed.jinja")
    with resources.as_file(resources.files("reprorl") / "examples" / "calc-train.jsonl") as path:
        (tmp / "short.jsonl").write_text("".join(path.read_text().splitlines(keepends=True)[:12]))
    store.add("calc-train-short", tmp / "short.jsonl", kind="taskset")
    other = tiny_model(1)  # another base: same shapes, other weights
    save_model(other.model, other.tokenizer, tmp / "tiny-b")
    store.add("tiny-b", tmp / "tiny-b", kind="model")
    with resources.as_file(resources.files("reprorl") / "examples" / "calc-eval.jsonl") as path:
        (tmp / "short-eval.jsonl").write_text("".join(path.read_text().splitlines(keepends=True)[:8]))
    store.add("calc-eval-short", tmp / "short-eval.jsonl", kind="taskset")
    out: dict[str, tuple[dict[str, Any], RunSpec]] = {}
    behaviour.clear()
    records.clear()
    for name, changes in [("base", {}), *VARIANTS.items()]:
        (tmp / f"{name}.toml").write_text(BASE)
        overrides = [f"{path}={_toml(value)}" for path, value in changes.items()]
        before = set(run_ids(home))
        code = main(["--home", str(home), "run", str(tmp / f"{name}.toml"), *overrides])
        (run_id,) = set(run_ids(home)) - before
        record = records[name] = RunRecord(store, run_id)
        document = json.loads((record.path / EFFECTIVE_FILE).read_text())
        out[name] = (document["fields"], stored_spec(record.spec()))
        behaviour[name] = [
            {k: v for k, v in m.items() if not k.endswith(("_s", "cpu_s"))} for m in record.metrics().records
        ]
        assert code == 0 or name in ("judge", "checklist"), (name, record.status())  # no judge server there
    yield out
    patch.undo()


def test_every_leaf_field_is_exercised_or_listed_with_why() -> None:
    leaves = schema_leaves(RunSpec)
    missing = [leaf for leaf in leaves if not _covered(leaf)]
    print(f"{len(leaves)} RunSpec leaf fields: {len(leaves) - len(LABELS) - len(REFUSED)} exercised, "
          f"{len(LABELS)} label-only, {len(REFUSED)} refused by training")  # fmt: skip
    assert not missing, f"fields neither exercised nor listed: {missing}"
    assert len(leaves) >= 90


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_changed_field_takes_effect_and_the_record_says_so(
    runs: dict[str, tuple[dict[str, Any], RunSpec]], variant: str
) -> None:
    base, base_spec = runs["base"]
    fields, spec = runs[variant]
    assert disagreements(spec, fields) == []  # every component used what the spec says
    before = _leaf_values(base_spec)
    wanted = {
        p: v
        for p, v in _leaf_values(spec).items()
        if _changed(p, VARIANTS[variant]) and before.get(p) != v and p not in LABELS  # a label: no component
    }
    assert wanted
    for path, value in wanted.items():
        assert path in fields, f"{path}: no component reported it"
        assert fields[path] != base.get(path, "absent"), f"{path}: {value!r} changed nothing"
    assert behaviour[variant] != behaviour["base"]  # and the run went differently


def _leaf_values(spec: RunSpec) -> dict[str, Any]:
    from reprorl.orchestrate.run.effective import spec_fields

    return spec_fields(spec)


def _changed(path: str, changes: dict[str, Any]) -> bool:
    return any(path == p or path.startswith(p + ".") for p in changes)


def test_eval_rollouts_sample_at_the_eval_temperature_and_train_rollouts_at_the_learning_one(
    runs: dict[str, tuple[dict[str, Any], RunSpec]],
) -> None:
    _, spec = runs["sync"]
    temperatures = {
        (t.split, t.sampling.temperature) for t in RolloutStore(records["sync"]).trajectories() if t.sampling
    }
    assert spec.evaluation.temperature == 0.3 and spec.learning.temperature == 0.7
    assert temperatures == {("train", 0.7), ("eval", 0.3)}


def test_the_warm_start_follows_its_own_learning_rate_schedule(
    runs: dict[str, tuple[dict[str, Any], RunSpec]],
) -> None:
    _, spec = runs["sync"]
    rates = [m["sft_lr"] for m in records["sync"].metrics().records if m.get("stage") == "sft"]
    base = [m["sft_lr"] for m in records["base"].metrics().records if m.get("stage") == "sft"]
    assert spec.learning.sft_schedule == "linear" and base == []  # the base run has no warm start
    assert rates == pytest.approx([2e-3, 2e-3 * 2 / 3, 2e-3 / 3])  # linear from sft_lr toward zero


def test_the_warm_start_fits_at_its_own_temperature_and_rl_samples_at_the_learning_one(
    runs: dict[str, tuple[dict[str, Any], RunSpec]],
) -> None:
    _, spec = runs["sync"]
    (done,) = [e for e in records["sync"].events().records if e["event"] == "sft_done"]
    assert spec.learning.sft_temperature == 0.5 and done["temperature"] == 0.5
    train = {t.sampling.temperature for t in RolloutStore(records["sync"]).trajectories("split = 'train'")}
    assert train == {spec.learning.temperature} == {0.7}
