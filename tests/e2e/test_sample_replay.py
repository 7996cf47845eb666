"""`reprorl sample`, then `reprorl replay` on the tiny model: same seed, same groups, exact replays."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from cli_support import Cli

from reprorl.cli.main import main
from reprorl.orchestrate.jobs import replay as replay_module
from reprorl.orchestrate.jobs import replay_policy
from reprorl.policy import save_model, tiny_model
from reprorl.store import Store

SPEC = """
name = "tiny-sample"
seed = 3
[model]
owner = "t@x"
base = "tiny"
[data]
owner = "t@x"
train = "calc-train"
[learning]
owner = "t@x"
group_size = 4
tasks_per_step = 2
max_tokens = 24
max_turns = 3
rollout_concurrency = 8
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
[budget.prices]
cpu_usd_per_hour = 0.05
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("sample")
    model = tiny_model(0)
    save_model(model.model, model.tokenizer, root / "tiny-model")
    store = Store(root / "home")
    store.add("tiny", root / "tiny-model", kind="model")
    examples = resources.files("reprorl") / "examples"
    for name in ("calc-train", "calc-eval"):
        with resources.as_file(examples / f"{name}.jsonl") as path:
            store.add(name, path, kind="taskset")
    store.close()
    (root / "spec.toml").write_text(SPEC)
    yield root


def _cli(home: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(home / "home", capsys)


def _rows(cli: Cli, run: str, *columns: str) -> list[dict[str, Any]]:
    rows = cli.ok_json(
        "runs", "rollouts", run, "--limit", "1000", *(("--columns", ",".join(columns)) if columns else ())
    )
    assert isinstance(rows, list)
    return rows


def _by_member(cli: Cli, run: str) -> dict[tuple[int, str, int], Any]:
    out = {}
    for row in _rows(cli, run, "step", "task_id", "member", "reward_total", "record"):
        record = json.loads(row["record"])
        tokens = [t["token_ids"] for t in record["turns"]]
        logprobs = [t["logprobs"] for t in record["turns"]]
        out[(row["step"], row["task_id"], row["member"])] = (tokens, logprobs, row["reward_total"])
    return out


@pytest.fixture(scope="module")
def runs(home: Path) -> tuple[str, str]:
    """Two runs of the same spec and seed."""
    return _sample(home), _sample(home)


def _sample(home: Path) -> str:
    """Record a run through the CLI; run ids sort by creation time, so the newest is it."""
    argv = ["--home", str(home / "home"), "sample", str(home / "spec.toml"), "--steps", "2", "--no-progress"]
    assert main(argv) == 0
    return max(p.name for p in (home / "home" / "runs").iterdir() if not p.name.startswith("."))


def test_same_seed_gives_the_same_groups_and_members_differ(
    home: Path, runs: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cli = _cli(home, capsys)
    first, second = runs
    assert first != second
    a, b = _by_member(cli, first), _by_member(cli, second)
    assert len(a) == 16 and a == b
    groups: dict[tuple[int, str], list[Any]] = {}
    for (step, task, _), (tokens, _, _) in a.items():
        groups.setdefault((step, task), []).append(json.dumps(tokens))
    assert len(groups) == 4
    assert all(len(set(members)) == 4 for members in groups.values())
    rows = _rows(cli, first)
    assert all(r["termination"] != "infra_error" and r["cost_usd"] > 0 for r in rows)
    assert all(r["prompt_template_hash"].startswith("sha256:") for r in rows)
    assert all(r["base_model_hash"].startswith("sha256:") and r["policy_version"] for r in rows)


def test_replay_is_bit_identical_in_both_modes(
    home: Path, runs: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cli = _cli(home, capsys)
    ids = [r["rollout_id"] for r in _rows(cli, runs[0])]
    for rollout_id in random.Random(0).sample(ids, 2):
        for mode in ("recorded", "live"):
            report = cli.ok_json("replay", rollout_id, "--mode", mode)
            assert report["identical"], report
            assert report["tokens"] > 0 and report["first_difference"] is None
    code, out, _ = cli("replay", ids[0])
    assert code == 0 and out.startswith("identical: ")
    # Many at once: rollouts that shared a batch share its re-run.
    code, out, _ = cli("replay", "--run", runs[0], "--random", "8", "--mode", "recorded")
    summary = out.strip().splitlines()[-1]
    assert code == 0 and summary.startswith("8/8 identical (recorded replay, ")
    assert int(summary.split(", ")[1].split()[0]) < 8


def test_replay_names_the_first_difference(
    home: Path, runs: tuple[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A positive control: replayed in another precision, the replay must report a difference."""
    cli = _cli(home, capsys)
    rollout_id = _rows(cli, runs[1])[0]["rollout_id"]
    opened = replay_policy.open_policy

    def in_bfloat16(*args: Any, **kwargs: Any) -> Any:
        return opened(*args, **{**kwargs, "dtype": "bfloat16"})

    monkeypatch.setattr(replay_policy, "open_policy", in_bfloat16)
    store = Store(home / "home")
    report = asyncio.run(replay_module.replay(store, rollout_id, mode="recorded"))
    assert not report.identical and report.first is not None
    assert report.first.where in ("token", "logprob") and report.first.turn == 0
    code, out, _ = cli("replay", rollout_id, "--mode", "recorded")
    assert code == 1 and out.startswith(f"differs: {rollout_id}: first difference is the ")


def test_replay_refuses_bad_ids(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli = _cli(home, capsys)
    assert "is not a rollout id" in cli.error("replay", "nonsense")
    assert "no run" in cli.error("replay", "20990101T000000000000Z-abcdef/train/0/t/0").lower()
    assert "--mode" in cli.error("replay", "x/y", "--mode", "fast")
    assert "--random needs --run" in cli.error("replay", "--random", "3")
    assert "name rollout ids" in cli.error("replay")


def test_a_turn_that_took_its_previous_turns_kept_cache_replays_bit_for_bit(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Episodes that go on past their first turn (the tiny model's stray tool tags are parse errors,
    which the env answers) continue from their previous turn's kept cache; replaying such a turn
    re-runs the batches it depends on, in a fresh replayer, and gives the same bits."""
    spec = SPEC.replace("max_tokens = 24", "max_tokens = 64").replace(
        "tasks_per_step = 2", "tasks_per_step = 4"
    )
    (home / "multi.toml").write_text(spec)
    argv = ["--home", str(home / "home"), "sample", str(home / "multi.toml"), "--steps", "1", "--no-progress"]
    assert main(argv) == 0
    capsys.readouterr()
    run = max(p.name for p in (home / "home" / "runs").iterdir() if not p.name.startswith("."))
    cli = _cli(home, capsys)
    continued = []
    for row in _rows(cli, run, "rollout_id", "record"):
        turns = json.loads(row["record"])["turns"]
        for later in turns[1:]:
            context = sum(len(t["prompt_token_ids"]) + len(t["token_ids"]) for t in turns[: later["index"]])
            assert later["reused"] == context - 1  # every position but the last sampled token's
            continued.append(row["rollout_id"])
    assert continued, "no episode of this seed went past its first turn"
    for rollout_id in sorted(set(continued))[:2]:
        for mode in ("recorded", "live"):
            store = Store(home / "home")
            report = asyncio.run(replay_module.replay(store, rollout_id, mode=mode))
            assert report.identical, report
            assert report.turns >= 2
