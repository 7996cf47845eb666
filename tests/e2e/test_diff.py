"""`reprorl runs diff`: a planted-change test (8 variants of one short run, each naming just its one change),
and the code, package and hardware conditions read from run records."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cli_support import tiny_training_store

import reprorl.store.runs as runs_module
from reprorl.cli.main import main
from reprorl.config import RunSpec
from reprorl.envs.families.calculator import CalculatorEnv, calc
from reprorl.hashing import content_hash, module_fingerprint
from reprorl.orchestrate.run.rollouts import load_taskset
from reprorl.policy import save_model, tiny_model
from reprorl.rewards.base import Verifier
from reprorl.rewards.verifiers.numeric import NumericAnswer
from reprorl.rollout.families import FAMILIES, Family
from reprorl.store import RunRecord, Store
from reprorl.store.environment import capture_environment, git_state
from reprorl.types import Message, Role, Split, TaskSet

SPEC = """
name = "tiny-diff"
seed = {seed}
[model]
owner = "t@x"
base = "{base}"
adapter = {{ kind = "lora", rank = {rank}, alpha = 8.0, targets = ["q_proj", "v_proj"] }}
[data]
owner = "t@x"
train = "{train}"
reward_weights = {{ outcome = 1.0, valid_calls = 1.0 }}
[learning]
owner = "t@x"
steps = 1
lr = 1e-3
group_size = 2
tasks_per_step = 1
max_tokens = 12
max_turns = 2
temperature = {temperature}
[evaluation]
owner = "t@x"
suites = ["{suite}"]
"""
BASE = {
    "seed": 1,
    "base": "tiny@v1",
    "rank": 4,
    "train": "calc-train@v1",
    "temperature": 1.0,
    "suite": "calc-eval@v1",
}

# The host-side `ask_human` tool of the planted calculator family, at two revisions of its module:
# same name, description and schema; only the code differs.
TOOL_MODULE = '''
"""Tools of the planted calculator family (written by test_diff)."""

from typing import Any

from reprorl.envs.tool import tool
from reprorl.types import Permission


@tool(Permission.HUMAN, params={{"question": "What you need a person to decide or tell you."}}, host=True)
def ask_human(ctx: Any, question: str) -> str:
    """Ask a human operator for help. Use only when you cannot proceed; every call is counted."""
    {body}
'''
TOOL_REVISIONS = {
    "v1": 'raise RuntimeError("answered by the environment")',
    "v2": 'raise RuntimeError(f"answered by the environment, not by the sandbox: {question!r}")',
}


@pytest.fixture
def frozen_environment(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every run of a test records the environment captured once at its start.

    The runs share one process and one machine; only other processes editing this checkout (or
    installing packages) while the test runs could make their code or package records differ,
    and that would be a real difference that this test did not plant.
    """
    captured = capture_environment()
    monkeypatch.setattr(runs_module, "capture_environment", lambda: captured)
    return captured


@pytest.fixture
def planted_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Install a calculator family whose `ask_human` lives in `planted_tools` at a given revision."""
    for revision, body in TOOL_REVISIONS.items():
        (tmp_path / revision).mkdir()
        (tmp_path / revision / "planted_tools.py").write_text(TOOL_MODULE.format(body=body))

    planted = contextlib.ExitStack()

    def install(revision: str = "v1", verifier: Verifier | None = None) -> None:
        module = _load_module("planted_tools", tmp_path / revision / "planted_tools.py", monkeypatch)
        env = type("PlantedCalculatorEnv", (CalculatorEnv,), {"tools": (calc, module.ask_human)})
        builtin = FAMILIES["calculator"]
        family = Family(
            "calculator",
            env,
            verifier or NumericAnswer(),
            builtin.generate,
            builtin.oracle,
            builtin.tool_modules,
        )
        planted.enter_context(FAMILIES.override("calculator", family))

    with planted:
        yield install
    module_fingerprint.cache_clear()  # forget the planted module's revisions


def _load_module(name: str, path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """`path` as *the* module `name`, like a checkout of it at some revision."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    # A process normally never sees a module's code change; this test swaps revisions between
    # runs, so the cached fingerprints must go before the tool is declared again.
    module_fingerprint.cache_clear()
    spec.loader.exec_module(module)
    return module


def _second_versions(tmp_path: Path, store: Store) -> None:
    """tiny@v2 (other weights), calc-train@v2 (one task reworded), calc-eval@v2 (one task more)."""
    other = tiny_model(1)
    save_model(other.model, other.tokenizer, tmp_path / "tiny-1")
    assert store.add("tiny", tmp_path / "tiny-1", kind="model").version == 2
    train = load_taskset(store, "calc-train@v1")
    first = next(i for i, t in enumerate(train.tasks) if t.split == Split.TRAIN)
    task = train.tasks[first]
    reworded = task.model_copy(
        update={"prompt": (Message(role=Role.USER, content=task.prompt[-1].content + " Be exact."),)}
    )
    tasks = (*train.tasks[:first], reworded, *train.tasks[first + 1 :])
    added = store.add_bytes("calc-train", TaskSet(name="calc-train", tasks=tasks).to_jsonl(), kind="taskset")
    assert added.version == 2
    suite = load_taskset(store, "calc-eval@v1")
    extra = suite.tasks[0].model_copy(update={"id": "calc-eval-extra-1", "prompt": suite.tasks[1].prompt})
    grown = TaskSet(name="calc-eval", tasks=(*suite.tasks, extra)).to_jsonl()
    assert store.add_bytes("calc-eval", grown, kind="taskset").version == 2


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], **changes: Any) -> str:
    (tmp_path / "spec.toml").write_text(SPEC.format(**{**BASE, **changes}))
    capsys.readouterr()
    assert main(["--home", str(tmp_path / "home"), "run", str(tmp_path / "spec.toml")]) == 0
    return capsys.readouterr().out.split("run ", 1)[1].split()[0]


def _diff(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["--home", str(tmp_path / "home"), "runs", "diff", *args])
    return code, capsys.readouterr().out


def test_diff_names_exactly_the_one_planted_condition_of_each_variant(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    frozen_environment: dict[str, Any],
    planted_family: Callable[..., None],
) -> None:
    store = tiny_training_store(tmp_path)
    _second_versions(tmp_path, store)
    planted_family()
    base = _run(tmp_path, capsys)

    code, out = _diff(tmp_path, capsys, base, base, "--json")
    same = json.loads(out)
    assert code == 0 and same["conditions"] == same["derived"] == same["labels"] == []
    assert same["comparable"] and same["metrics"][0]["difference"]["b_minus_a"] == 0.0

    # (what changes, how the variant is made, the one condition diff must name)
    variants: list[tuple[str, dict[str, Any], dict[str, Any], tuple[str, str]]] = [
        ("base model file", {"base": "tiny@v2"}, {}, ("artifacts", "model.base")),
        ("adapter rank", {"rank": 8}, {}, ("spec", "model.adapter.rank")),
        ("train task-set version", {"train": "calc-train@v2"}, {}, ("artifacts", "data.train")),
        ("a tool's code", {}, {"revision": "v2"}, ("artifacts", "tool.ask_human")),
        ("sampling temperature", {"temperature": 0.7}, {}, ("spec", "learning.temperature")),
        ("verifier", {}, {"verifier": NumericAnswer(abs_tol=1e-3)}, ("artifacts", "verifier.calculator")),
        ("eval suite", {"suite": "calc-eval@v2"}, {}, ("artifacts", "evaluation.suites")),
        ("seed", {"seed": 2}, {}, ("seeds", "seed")),
    ]
    named: dict[str, list[tuple[str, str]]] = {}
    reports: dict[str, dict[str, Any]] = {}
    for what, spec_changes, family_changes, _ in variants:
        planted_family(**family_changes)
        variant = _run(tmp_path, capsys, **spec_changes)
        planted_family()
        code, out = _diff(tmp_path, capsys, base, variant, "--json")
        assert code == 0, out
        reports[what] = json.loads(out)
        named[what] = [(c["group"], c["field"]) for c in reports[what]["conditions"]]
    exact = [what for what, _, _, expected in variants if named[what] == [expected]]
    assert len(exact) == 8, f"{len(exact)}/8 named exactly their change: {named}"

    for what, report in reports.items():
        assert report["labels"] == [], what  # same name and owners: nothing for people differs
        (condition,) = report["conditions"]
        assert condition["a"] != condition["b"], what
        if what == "eval suite":
            continue
        assert report["comparable"], what
        (suite,) = report["metrics"]
        d, a, b = suite["difference"], suite["a"], suite["b"]
        assert a["version"] == b["version"] == "calc-eval@v1" and d["tasks"] == 32
        assert d["b_minus_a"] == pytest.approx(b["success"] - a["success"])
        assert d["low"] <= d["b_minus_a"] <= d["high"] and 0.0 <= d["p_value"] <= 1.0

    # Artifact references read as registry versions with a short hash.
    model = reports["base model file"]["conditions"][0]
    assert model["a"].startswith("tiny@v1 (sha256:") and model["b"].startswith("tiny@v2 (sha256:")
    assert len(model["a"]) == len("tiny@v1 (sha256:") + 12 + 1
    suites = reports["eval suite"]["conditions"][0]
    assert [s.split()[0] for s in (*suites["a"], *suites["b"])] == ["calc-eval@v1", "calc-eval@v2"]
    tool = reports["a tool's code"]["conditions"][0]
    assert tool["a"].startswith("sha256:") and len(tool["a"]) == len(tool["b"]) == 71  # recorded hashes
    # The env's version contains its tools' versions: it differs too, but only as a consequence.
    (env,) = reports["a tool's code"]["derived"]
    assert env["field"] == "env.calculator" and env["note"] == "follows from tool.ask_human"
    assert all(r["derived"] == [] for what, r in reports.items() if what != "a tool's code")

    # Another suite version: not comparable, each run's figures shown on its own version.
    apart = reports["eval suite"]
    assert not apart["comparable"] and apart["not_comparable"]
    (suite,) = apart["metrics"]
    assert not suite["comparable"] and suite["difference"] is None and suite["deltas"] == {}
    assert "calc-eval@v1" in suite["reason"] and "calc-eval@v2" in suite["reason"]
    assert (suite["a"]["version"], suite["a"]["tasks"]) == ("calc-eval@v1", 32)
    assert (suite["b"]["version"], suite["b"]["tasks"]) == ("calc-eval@v2", 33)
    assert suite["a"]["splits"] == suite["b"]["splits"] == ["eval"]

    # For people: the banner is loud, the changed condition and its consequence are named.
    variant_ids = {what: report["run_b"] for what, report in reports.items()}
    code, text = _diff(tmp_path, capsys, base, variant_ids["eval suite"])
    assert code == 0 and "NOT COMPARABLE" in text.splitlines()[2]
    assert "evaluation.suites" in text and "calc-eval@v2" in text and "B - A success" not in text
    code, text = _diff(tmp_path, capsys, base[:22], variant_ids["a tool's code"])
    assert code == 0 and "NOT COMPARABLE" not in text
    assert "tool.ask_human" in text and "env.calculator" in text and "B - A success:" in text


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@x", *args], cwd=repo, check=True, capture_output=True
    )


def test_diff_reads_code_packages_and_hardware_from_the_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tiny_training_store(tmp_path)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "loss.py").write_text("CLIP = 0.2\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "one")
    (repo / "loss.py").write_text("CLIP = 0.25\n")
    dirty_a = git_state(repo)
    (repo / "loss.py").write_text("CLIP = 0.3\n")
    (repo / "notes.txt").write_text("tried 0.3\n")
    dirty_b = git_state(repo)

    env_a = capture_environment(repo)
    env_a["code"] = {"cwd": dirty_a}
    env_b = copy.deepcopy(env_a)
    env_b["code"] = {"cwd": dirty_b}
    env_b["packages"]["torch"] = "9.9.9"
    env_b["cpu"]["count"] = 64
    env_b["gpus"] = ["NVIDIA H200, 570.00, 143771 MiB"]
    env_b["env"] = {**env_a["env"], "OMP_NUM_THREADS": "16", "REPRORL_HOME": "/elsewhere"}
    env_b["hostname"], env_b["executable"] = "another-host", "/opt/venv/bin/python"
    env_c = copy.deepcopy(env_a)
    env_c["code"] = {"cwd": {**{k: dirty_a[k] for k in ("root", "commit")}, "dirty": False}}

    spec = RunSpec.model_validate(
        {
            "seed": 3,
            "model": {"owner": "t@x", "base": store.pin("tiny@v1")},
            "data": {"owner": "t@x", "train": store.pin("calc-train@v1")},
            "learning": {"owner": "t@x"},
            "evaluation": {"owner": "t@x", "suites": [store.pin("calc-eval@v1")]},
        }
    )
    other = spec.model_copy(
        update={
            "name": "renamed",
            "data": spec.data.model_copy(
                update={"owner": "bob@x", "noise": spec.data.noise.model_copy(update={"timeout_p": 0.1})}
            ),
        }
    )
    ids = []
    for run_spec, env in ((spec, env_a), (other, env_b), (spec, env_c)):
        monkeypatch.setattr(runs_module, "capture_environment", lambda env=env: env)
        dumped = run_spec.model_dump(mode="json")
        record = RunRecord.create(
            store, spec=dumped, spec_hash=content_hash(dumped), name=run_spec.name, seeds={"root": 3}
        )
        ids.append(record.run_id)

    code, out = _diff(tmp_path, capsys, ids[0], ids[1], "--json")
    assert code == 0
    report = json.loads(out)
    fields = {c["field"]: c for c in report["conditions"]}
    assert set(fields) == {
        "data.noise.timeout_p",
        "code.cwd.diff",
        "code.cwd.untracked",
        "packages.torch",
        "cpu.count",
        "gpus",
        "envvar.OMP_NUM_THREADS",
    }
    assert fields["data.noise.timeout_p"]["group"] == "noise"
    assert (fields["packages.torch"]["group"], fields["packages.torch"]["b"]) == ("packages", "9.9.9")
    assert fields["code.cwd.untracked"]["b"] == ["notes.txt"]
    dirty = fields["code.cwd.diff"]
    assert dirty["group"] == "code" and dirty["note"] == "both were dirty"
    assert "-+CLIP = 0.25" in dirty["detail"] and "++CLIP = 0.3" in dirty["detail"]
    assert {c["field"] for c in report["labels"]} == {"name", "data.owner"}
    assert not report["comparable"] and report["not_comparable"] == ["neither run has an eval point"]

    code, text = _diff(tmp_path, capsys, ids[0], ids[1])
    assert code == 0 and "NOT COMPARABLE" in text and "++CLIP = 0.3" in text

    # A clean tree against a dirty one: the dirty flag is the condition; the diff follows from it.
    code, out = _diff(tmp_path, capsys, ids[2], ids[0], "--json")
    clean = json.loads(out)
    assert [(c["field"], c["a"], c["b"]) for c in clean["conditions"]] == [("code.cwd.dirty", False, True)]
    (diff,) = clean["derived"]
    assert diff["field"] == "code.cwd.diff" and diff["a"] is None and diff["b"].endswith("lines)")
    assert diff["note"] == "follows from code.cwd.dirty" and clean["labels"] == []
