"""An OpenEnv server as a reprorl env family: the example guess env (openenv-core's own server classes).

reprorl starts the server on 127.0.0.1; the oracle solves every task and a policy that answers
without calling the env gets nothing; the tiny model trains two steps on it and ten of its rollouts
replay bit for bit from the record; a server that dies mid-run costs the episodes it held an
`infra_error`, which run again on a server started afresh, and the run finishes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import Cli, run_ids, tiny_spec, tiny_training_store

from reprorl.envs.base import EnvConfig
from reprorl.envs.sandbox import SandboxPool
from reprorl.examples.openenv_guess import SERVE_ON
from reprorl.rewards import VerifierRunner
from reprorl.rollout.episode import EpisodeIds, EpisodeLimits, ScriptedPolicy, run_episode
from reprorl.rollout.external_families import OpenEnvServerSpec, openenv_family, served
from reprorl.rollout.families import FAMILIES, get_family, register_family
from reprorl.store import find_run
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import Split, Termination

ENVS = Path(__file__).resolve().parents[1] / "envs"


@pytest.fixture(autouse=True, scope="module")
def guess() -> Iterator[None]:
    """The example family, registered as a package's entry point would (its server is the module's)."""
    from reprorl.examples.openenv_guess import FAMILY

    register_family(FAMILY)
    try:
        yield
    finally:
        found = served(FAMILY)
        if found is not None:
            found.kill()
        FAMILIES.remove(FAMILY.name)


def _episodes(family_name: str, scripts: dict[str, object], tasks: int) -> dict[str, list[object]]:
    family = get_family(family_name)
    sets = family.generate(0, train=tasks, eval=0, holdout=0)

    async def run() -> dict[str, list[object]]:
        out: dict[str, list[object]] = {name: [] for name in scripts}
        async with SandboxPool(family.tool_modules) as pool, VerifierRunner() as verifiers:
            for task in sets[Split.TRAIN].tasks:
                for name, script in scripts.items():
                    out[name].append(
                        await run_episode(
                            family.env(EnvConfig(), seed=0),
                            task,
                            ScriptedPolicy(task, script),  # type: ignore[arg-type]
                            verifier=family.verifier,
                            sandboxes=pool,
                            verifiers=verifiers,
                            ids=EpisodeIds("run", f"run/train/0/{task.id}/{name}", "g", 7),
                            limits=EpisodeLimits(max_turns=10),
                        )
                    )
        return out

    return asyncio.run(run())


def test_the_oracle_solves_it_and_an_answer_without_the_env_gets_nothing() -> None:
    got = _episodes(
        "openenv-guess", {"oracle": get_family("openenv-guess").oracle, "guess": lambda t, m: "It is 42."}, 3
    )
    for t in got["oracle"]:
        assert t.termination is Termination.ENV_DONE and t.reward and t.reward.components["outcome"] == 1.0
        steps = [r for turn in t.turns for r in turn.tool_results]
        assert [r.env_done for r in steps] == [False] * (len(steps) - 1) + [True]
        assert [r.env_reward for r in steps][-1] == 1.0 and json.loads(steps[-1].content)["hint"] == "correct"
        assert t.env_version.startswith("sha256:") and t.tool_versions["guess"]
        assert t.env["kind"] == "openenv" and t.env["server"] == "guess" and t.env["package_version"]
        assert str(t.env["schema_hash"]).startswith("sha256:")
    for t in got["guess"]:
        assert t.termination is Termination.ANSWERED and t.reward and t.reward.components["outcome"] == 0.0


def test_the_env_version_is_the_servers_identity() -> None:
    family = get_family("openenv-guess")
    server = served(family)
    assert server is not None
    identity = server.identity()
    assert identity["schema"]["action"]["properties"]["guess"]["maximum"] == 100
    assert identity["package"] == "reprorl" and identity["package_version"]
    assert family.env.version() == family.env.version()


def test_the_tiny_model_trains_on_it_and_its_rollouts_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tiny_training_store(tmp_path)
    cli = Cli(tmp_path / "home", capsys)
    code, _, err = cli("tasks", "generate", "openenv-guess", "--train", "8", "--eval", "4", "--holdout", "0")
    assert code == 0, err
    spec = tiny_spec(
        "openenv-train",
        data={"train": "openenv-guess-train", "reward_weights": {"outcome": 1.0, "valid_calls": 1.0}},
        evaluation={"suites": ["openenv-guess-eval"]},
        learning={"max_turns": 3},
    )
    (tmp_path / "spec.toml").write_text(spec)
    code, _, err = cli("run", str(tmp_path / "spec.toml"))
    assert code == 0, err
    (run_id,) = run_ids(tmp_path / "home")
    record = find_run(store, run_id)
    steps = [m for m in record.metrics().records if m.get("stage") is None]
    assert [m["step"] for m in steps] == [0, 1]
    assert any(m["train/grad_norm"] > 0 for m in steps)  # the weights moved
    rollouts = list(RolloutStore(record).trajectories())
    assert {t.env_version for t in rollouts} == {get_family("openenv-guess").env.version()}
    assert all(t.reward is not None and "env/done" in t.reward.components for t in rollouts)
    code, out, err = cli("replay", "--run", run_id, "--random", "10", "--mode", "recorded", "--json")
    assert code == 0, (out, err)
    reports = json.loads(out)
    assert len(reports) == 10 and all(r["identical"] for r in reports)
    # Live, the server runs each episode again: the same observations, rewards and tokens.
    code, out, err = cli("replay", "--run", run_id, "--random", "2", "--seed", "1", "--json")
    assert code == 0, (out, err)
    assert [r["identical"] and r["mode"] == "live" for r in json.loads(out)] == [True, True]


@pytest.fixture
def dying(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("REPRORL_TEST_DIE_AT", "5")
    monkeypatch.setenv("REPRORL_TEST_DIE_MARKER", str(tmp_path / "died"))
    server = OpenEnvServerSpec(
        command=(sys.executable, "-m", "uvicorn", "dying_guess:app", "--app-dir", str(ENVS), *SERVE_ON),
        package="reprorl",
        name="dying-guess",
        startup_timeout_s=60,
    )
    example = get_family("openenv-guess")
    family = openenv_family(
        "openenv-dying",
        server,
        tool="guess",
        instruction="Find the secret number from 1 to 100 with the guess tool, then say it.",
        oracle=example.oracle,
        impossible=example.impossible,
    )
    register_family(family)
    try:
        yield family.name
    finally:
        found = served(family)
        if found is not None:
            found.kill()
        FAMILIES.remove(family.name)


def test_a_server_killed_mid_run_is_an_infra_failure_retried_on_a_new_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dying: str
) -> None:
    store = tiny_training_store(tmp_path)
    cli = Cli(tmp_path / "home", capsys)
    code, _, err = cli("tasks", "generate", dying, "--train", "8", "--eval", "2", "--holdout", "0")
    assert code == 0, err
    spec = tiny_spec(
        "openenv-dying",
        data={"train": f"{dying}-train", "reward_weights": {"outcome": 1.0, "valid_calls": 1.0}},
        evaluation={"suites": [f"{dying}-eval"]},
    )
    (tmp_path / "spec.toml").write_text(spec)
    code, _, err = cli("run", str(tmp_path / "spec.toml"))
    assert code == 0, err
    assert (tmp_path / "died").exists()
    (run_id,) = run_ids(tmp_path / "home")
    record = find_run(store, run_id)
    assert record.status()["status"] == "succeeded"
    rollouts = list(RolloutStore(record).trajectories("split = 'train'"))
    failed = [t for t in rollouts if t.retried]
    assert failed and all(t.termination is Termination.INFRA_ERROR for t in failed)
    assert all("dying-guess" in (t.error or "") for t in failed), [t.error for t in failed]
    # Every planned rollout has one final record (steps x tasks x members); a failed one's is its rerun.
    finals = {t.rollout_id.split("~", 1)[0]: t for t in rollouts if not t.retried}
    assert len(finals) == 2 * 2 * 2
    for t in failed:
        again = finals[t.rollout_id]
        assert again.rollout_id == f"{t.rollout_id}~1" and again.infra_retries >= 1
        assert again.termination is not Termination.INFRA_ERROR and again.reward is not None


def test_every_episode_closes_its_session_so_more_run_than_the_server_holds_at_once() -> None:
    # The example server holds 64 sessions; a leaked session per episode would refuse the 65th.
    got = _episodes("openenv-guess", {"guess": lambda t, m: "It is 42."}, 70)
    assert [t.termination for t in got["guess"]] == [Termination.ANSWERED] * 70


def test_a_server_that_cannot_start_is_named_with_its_last_words_and_leaves_no_log() -> None:
    from reprorl.envs.external import ExternalEnvError, OpenEnvServer

    crash = "import sys; print('no such env', file=sys.stderr); sys.exit(3)"
    server = OpenEnvServer(
        OpenEnvServerSpec(
            command=(sys.executable, "-c", crash, "{port}"), name="broken", startup_timeout_s=20
        )
    )
    with pytest.raises(ExternalEnvError, match=r"'broken' exited with 3 while starting: no such env"):
        server.base_url()
    assert server._child is not None
    log = server._child.log
    assert log is not None and log.exists()
    server.kill()
    assert not log.exists() and server.starts == 1
