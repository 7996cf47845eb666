"""Every Python block in the docs and the README imports only from `reprorl` (never a submodule) and
is run by a test as written: the walkthrough's in test_plugin_package.py, the others here."""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import test_plugin_package
import test_serve_policy
from cli_support import Cli, run_ids, tiny_spec, tiny_training_store

from judge_server import app, naive, serve
from reprorl.config import JUDGES, load_spec, resolve_spec
from reprorl.config.judge import judge_id
from reprorl.config.load import load_judge_config
from reprorl.evaluation.judge import make_judge
from reprorl.orchestrate.jobs.sample import sample_run
from reprorl.policy import tiny_model
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import SampleRequest
from reprorl.store import find_run
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"])

# Each block is known by a line it holds, and run by the test named beside it.
WALKTHROUGH = test_plugin_package.test_a_family_and_a_loss_of_an_installed_package_train_by_name
BY_HAND = test_plugin_package.test_the_docs_episode_by_hand_runs_the_installed_family
RUNNERS: dict[str, Any] = {
    "class TodoEnv(ToolEnv):": WALKTHROUGH,
    'SandboxPool(["todo_family"])': BY_HAND,
    "@register_loss(SequencePGConfig)": WALKTHROUGH,
    "rollouts = RolloutStore(run)": "test_the_rollouts_block_queries_a_recorded_run",
    "with HttpSampler(base_url": "test_the_http_sampler_block_samples_from_a_served_policy",
    "@register_judge(PassFailConfig)": "test_the_judge_kind_block_is_selected_by_kind",
    "class RankAdvantage:": "test_the_advantage_block_is_selected_by_name",
    "def calculate(expression):": "test_the_agent_block_trains_through_the_proxy_and_replays",
    "def binary_search(task, messages):": "test_the_openenv_block_registers_a_family_the_audit_passes",
    "NOTEBOOK = MCPServerSpec(": "test_the_mcp_block_makes_a_family_whose_oracle_solves_it",
    # Run as written by `make test-verifiers` (verifiers needs a venv of its own).
    "class SumTaskset(": "test_the_verifiers_block_is_the_taskset_the_verifiers_adapter_tests_use",
    "class LedgerTaskset(": "test_the_verifiers_block_is_the_taskset_the_verifiers_adapter_tests_use",
}


def python_blocks() -> list[tuple[str, str]]:
    """(page, code) of every fenced Python block."""
    found = []
    for page in PAGES:
        for code in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
            found.append((page.relative_to(ROOT).as_posix(), code))
    return found


def block_with(marker: str) -> str:
    (code,) = [code for _, code in python_blocks() if marker in code]
    return code


def _parse(code: str) -> ast.Module:
    try:
        return ast.parse(code)
    except SyntaxError:  # top-level `await`: a block meant for an async context
        return ast.parse("async def _block():\n" + textwrap.indent(code, "    "))


@pytest.mark.parametrize(("page", "code"), python_blocks(), ids=lambda v: str(v)[:40])
def test_every_block_imports_only_from_reprorl_itself(page: str, code: str) -> None:
    for node in ast.walk(_parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert not node.module.startswith("reprorl."), f"{page}: from {node.module} import ..."
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("reprorl.") for a in node.names), (
                f"{page}: import of a submodule"
            )


def test_every_block_is_run_by_a_test() -> None:
    for page, code in python_blocks():
        markers = [m for m in RUNNERS if m in code]
        assert len(markers) == 1, f"{page}: a Python block no test runs (or two claim it):\n{code[:200]}"
        runner = RUNNERS[markers[0]]
        assert callable(runner) or callable(globals().get(str(runner))), runner


def test_the_rollouts_block_queries_a_recorded_run(tmp_path: Path) -> None:
    store = tiny_training_store(tmp_path)
    (tmp_path / "spec.toml").write_text(test_plugin_package.SPEC)
    spec = resolve_spec(load_spec(tmp_path / "spec.toml", pin_bare=store.pin_newest), store.pin)
    record = asyncio.run(sample_run(store, spec, steps=1, show_progress=False))
    namespace: dict[str, Any] = {"home": tmp_path / "home", "run_id": record.run_id[:20]}
    exec(block_with("rollouts = RolloutStore(run)"), namespace)  # the block as written
    assert namespace["run"].run_id == record.run_id
    assert namespace["first"].step == 0


def test_the_http_sampler_block_samples_from_a_served_policy(tmp_path: Path) -> None:
    tokenizer = tiny_model(0).tokenizer
    prompt = ChatRenderer(tokenizer).prompt_ids(test_serve_policy.CONVERSATION, test_serve_policy.TOOLS)
    params = SamplingParams(temperature=1.0, max_tokens=8)
    requests = [SampleRequest(f"r{i}", tuple(prompt), params, seed=i) for i in range(2)]
    with test_serve_policy.serving(tmp_path / "home", "--base", "tiny:0") as served:
        namespace: dict[str, Any] = {"base_url": served.url, "model": served.model(), "requests": requests}
        exec(block_with("with HttpSampler(base_url"), namespace)  # the block as written
    samples = namespace["samples"]
    assert len(samples) == 2 and all(s.token_ids for s in samples)


def test_the_judge_kind_block_is_selected_by_kind(tmp_path: Path) -> None:
    namespace: dict[str, Any] = {"__name__": "docs_judge"}
    exec(block_with("@register_judge(PassFailConfig)"), namespace)  # the block as written
    try:
        with serve(app(naive)) as url:
            scores = {}
            for threshold in (0.5, 0.7):
                path = tmp_path / f"judge-{threshold}.toml"
                path.write_text(
                    f'kind = "pass_fail"\nthreshold = {threshold}\nbase_url = "{url}"\nmodel = "m"\n'
                )
                config = load_judge_config(path)
                assert type(config).__name__ == "PassFailConfig"
                with make_judge(config, tmp_path / "cache") as judge:
                    # The naive judge model obeys a score written into the answer: 0.6 here.
                    scores[threshold] = (
                        judge.score(judge_rollout('{"score": 0.6}'), "Say a number."),
                        judge_id(config),
                    )
        assert scores[0.5][0].score == 1.0 and scores[0.7][0].score == 0.0
        assert scores[0.5][1] != scores[0.7][1]  # a kind's own field is part of the judge's name
    finally:
        JUDGES.remove("pass_fail")


def test_the_advantage_block_is_selected_by_name() -> None:
    from reprorl.config.advantage import ADVANTAGES
    from reprorl.config.spec import LearningSpec
    from reprorl.orchestrate.pipeline.steps import group_data
    from reprorl.types import Reward, Split, Termination, Trajectory, Turn

    exec(block_with("class RankAdvantage:"), {"__name__": "docs_advantage"})  # the block as written
    try:
        learning = LearningSpec(owner="o", advantage="rank", drop_zero_variance_groups=False)
        members = [
            Trajectory(
                run_id="r",
                rollout_id=f"r/{i}",
                group_id="g",
                split=Split.TRAIN,
                task_id="t",
                task_hash="h",
                turns=(Turn(index=0, prompt_token_ids=(1,), token_ids=(2,), logprobs=(-1.0,)),),
                reward=Reward(total=total, verifier_version="v"),
                termination=Termination.ANSWERED,
            )
            for i, total in enumerate((0.2, 5.0, -1.0))
        ]
        data, _ = group_data(members, learning)
        assert [d.advantage for d in data] == [0.0, 1.0, -1.0]  # ranks 1, 2, 0, centred
    finally:
        ADVANTAGES.remove("rank")


def judge_rollout(answer: str) -> Any:
    from reprorl.types import Split, Termination, Trajectory, Turn

    return Trajectory(
        run_id="run-1",
        rollout_id="run-1/r0000",
        split=Split.EVAL,
        task_id="t",
        task_hash="sha256:" + "0" * 64,
        turns=(Turn(index=0, text=answer, finish_reason="stop"),),
        termination=Termination.ANSWERED,
    )


def test_the_agent_block_trains_through_the_proxy_and_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tiny_training_store(tmp_path)
    agents = tmp_path / "agents"
    agents.mkdir()
    module = agents / "calculator_agent.py"
    module.write_text(block_with("def calculate(expression):"))  # the block as written
    small = tmp_path / "calc-eval-small.jsonl"
    small.write_bytes(b"".join(store.read("calc-eval@v1").splitlines(keepends=True)[:2]))
    store.add("calc-eval-small", small, kind="taskset")
    agent = f'[agent]\nowner = "you@example.com"\ncallable = "calculator_agent:agent"\npath = ["{agents}"]\n'
    (tmp_path / "spec.toml").write_text(
        tiny_spec("docs-agent", evaluation={"suites": ["calc-eval-small"]}) + agent
    )
    cli = Cli(tmp_path / "home", capsys)
    code, _, err = cli("run", str(tmp_path / "spec.toml"))
    assert code == 0, err
    (run_id,) = run_ids(tmp_path / "home")
    rollouts = list(RolloutStore(find_run(store, run_id)).trajectories())
    digest = "sha256:" + hashlib.sha256(module.read_bytes()).hexdigest()
    bad = [
        (t.termination, t.error, t.agent)
        for t in rollouts
        if not (t.agent["code_hash"] == digest and t.turns)
    ]
    assert rollouts and not bad, bad[:2]
    assert not [t.error for t in rollouts if t.termination.value == "agent_error"]
    chosen = next(t.rollout_id for t in rollouts if "/train/1/" in t.rollout_id)
    code, out, err = cli("replay", chosen, "--json")
    assert code == 0 and json.loads(out)["identical"], (out, err)


def test_the_openenv_block_registers_a_family_the_audit_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from reprorl.rollout.external_families import served
    from reprorl.rollout.families import FAMILIES

    exec(compile(block_with("def binary_search(task, messages):"), "docs/openenv.md", "exec"), {})
    try:
        cli = Cli(tmp_path / "home", capsys)
        code, out, err = cli("rewards", "audit", "my-guess", "--tasks", "3", "--json")
        assert code == 0, (out, err)
        (audit,) = json.loads(out)["verifiers"]
        assert audit["passed"], audit
    finally:
        server = served(FAMILIES["my-guess"])
        assert server is not None and server.starts == 1
        server.kill()
        FAMILIES.remove("my-guess")


def test_the_mcp_block_makes_a_family_whose_oracle_solves_it() -> None:
    from reprorl.envs.base import EnvConfig
    from reprorl.envs.sandbox import SandboxPool
    from reprorl.rewards import VerifierRunner
    from reprorl.rollout.episode import EpisodeIds, ScriptedPolicy, run_episode
    from reprorl.rollout.families import FAMILIES, get_family
    from reprorl.types import Split

    exec(compile(block_with("NOTEBOOK = MCPServerSpec("), "docs/mcp.md", "exec"), {})
    try:
        notes = get_family("notes")
        tasks = notes.generate(0, train=2, eval=0)[Split.TRAIN].tasks

        async def run() -> list[Any]:
            async with SandboxPool(notes.tool_modules) as pool, VerifierRunner() as verifiers:
                return [
                    await run_episode(
                        notes.env(EnvConfig(), seed=0),
                        task,
                        ScriptedPolicy(task, notes.oracle),
                        verifier=notes.verifier,
                        sandboxes=pool,
                        verifiers=verifiers,
                        ids=EpisodeIds("run", f"run/train/0/{task.id}/0", "g", 1),
                    )
                    for task in tasks
                ]

        for trajectory, task in zip(asyncio.run(run()), tasks, strict=True):
            assert trajectory.reward is not None and trajectory.reward.components["outcome"] == 1.0
            calls = [r.name for turn in trajectory.turns for r in turn.tool_results]
            assert calls == ["note"] * int(str(task.reference)) + ["count"]
    finally:
        FAMILIES.remove("notes")


def test_the_verifiers_block_is_the_taskset_the_verifiers_adapter_tests_use() -> None:
    adapter_tests = ROOT / "tests" / "verifiers_adapter"
    for marker, test_file in (
        ("class SumTaskset(", "test_verifiers_family.py"),
        ("class LedgerTaskset(", "test_verifiers_toolsets.py"),
    ):
        source = (adapter_tests / test_file).read_text()
        assert f'docs_family("{marker}"' in source
        compile(block_with(marker), "docs/verifiers.md", "exec")  # it parses here too
    assert '"docs" / "verifiers.md"' in (adapter_tests / "vf_support.py").read_text()
    assert "make test-verifiers" in (ROOT / ".ci" / "run").read_text()
