"""`reprorl runs rollouts` end to end: a real run's records queried as a table or JSON; one-line errors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from cli_support import Cli

from reprorl.hashing import content_hash
from reprorl.store import RunRecord, Store
from reprorl.store.rollouts import SUMMARY_COLUMNS, RolloutWriter
from reprorl.types import Trajectory
from rollout_records import KINDS, make

FAILED_WITH_TIMEOUT = "reward_total = 0 AND list_contains(tool_outcomes, 'tool_timeout')"


def new_run(home: Path) -> RunRecord:
    store = Store(home)
    spec = {"name": "rollouts-e2e"}
    try:
        return RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name="e2e", seeds={"g": 3})
    finally:
        store.close()


@pytest.fixture
def run(cli: Cli) -> tuple[RunRecord, list[Trajectory]]:
    record = new_run(cli.home)
    writer = RolloutWriter(record)
    everything = []
    for step in range(3):
        trajectories = [make(step * 100 + j, KINDS[j % len(KINDS)], record.run_id) for j in range(6)]
        writer.write(step, trajectories)
        everything += trajectories
    return record, everything


def test_help(cli: Cli) -> None:
    code, out, _ = cli("runs", "rollouts", "--help")
    assert code == 0 and "--where" in out and "--columns" in out and "--json" in out


def test_table_of_a_run_by_prefix(cli: Cli, run: tuple[RunRecord, list[Trajectory]]) -> None:
    record, everything = run
    code, out, err = cli("runs", "rollouts", record.run_id[:-2], "--limit", "4")
    assert code == 0, err
    for header in ("step", "rollout_id", "termination", "reward_total", "tool_outcomes"):
        assert header in out
    assert everything[1].rollout_id in out and "ok, tool_timeout" in out
    assert "4 of 18 rollouts (--limit to show more)" in out
    code, out, _ = cli("runs", "rollouts", record.run_id, "--limit", "0")
    assert code == 0 and "18 rollouts in run" in out and "--limit 0 shows none" in out


def test_the_questions_users_ask(cli: Cli, run: tuple[RunRecord, list[Trajectory]]) -> None:
    record, everything = run
    rows = cli.ok_json("runs", "rollouts", record.run_id, "--where", "termination='tool_timeout'")
    assert [r["rollout_id"] for r in rows] == sorted(
        t.rollout_id for t in everything if t.termination == "tool_timeout"
    )
    assert set(rows[0]) == set(SUMMARY_COLUMNS)
    assert rows[0]["reward_components"] == {"format": 0.5, "outcome": 0.0}  # a MAP becomes an object
    assert rows[0]["tool_outcomes"] == ["ok", "tool_timeout"]
    failed = cli.ok_json(
        "runs", "rollouts", record.run_id, "--where", FAILED_WITH_TIMEOUT, "--columns", "rollout_id"
    )
    assert failed == [{"rollout_id": t["rollout_id"]} for t in rows]  # the recovered ones scored 1
    code, out, _ = cli("runs", "rollouts", record.run_id, "--where", "step = 2 AND reward_total IS NULL")
    assert code == 0 and "infra_error" in out and "\n1 rollout\n" in out


def test_columns_and_full_records(cli: Cli, run: tuple[RunRecord, list[Trajectory]]) -> None:
    record, everything = run
    rows = cli.ok_json(
        "runs",
        "rollouts",
        record.run_id,
        "--columns",
        "rollout_id,record",
        "--where",
        "n_truncated_turns > 0",
    )
    truncated = [t for t in everything if t.termination == "max_tokens"]
    assert [Trajectory.model_validate_json(r["record"]) for r in rows] == truncated
    code, out, _ = cli(
        "runs", "rollouts", record.run_id, "--columns", "rollout_id,tool_calls", "--limit", "2"
    )
    assert code == 0 and "calculator:ok" in out


def test_a_run_without_rollouts(cli: Cli) -> None:
    record = new_run(cli.home)
    code, out, _ = cli("runs", "rollouts", record.run_id)
    assert code == 0 and f"no rollouts in run {record.run_id}" in out
    assert cli.ok_json("runs", "rollouts", record.run_id) == []


def test_errors_are_one_line_with_exit_code_2(
    cli: Cli, run: tuple[RunRecord, list[Trajectory]], tmp_path: Path
) -> None:
    record, _ = run
    target = tmp_path / "out.csv"
    assert "no run matches 'nope'" in cli.error("runs", "rollouts", "nope")
    assert "where: not a single SQL condition: it ends too early" in cli.error(
        "runs", "rollouts", record.run_id, "--where", "termination = 'x' AND"
    )
    assert "may read only the rollout table" in cli.error(
        "runs", "rollouts", record.run_id, "--where", "EXISTS (FROM read_csv('/etc/passwd'))"
    )
    assert "where: not a single SQL condition" in cli.error(
        "runs", "rollouts", record.run_id, "--where", f"1=1; COPY (SELECT * FROM rollouts) TO '{target}'"
    )
    assert not target.exists()
    assert "columns: unknown column 'nope'" in cli.error(
        "runs", "rollouts", record.run_id, "--columns", "nope"
    )
    assert "--limit" in cli.error("runs", "rollouts", record.run_id, "--limit", "-1")


def test_a_corrupt_part_is_reported_not_read(cli: Cli, run: tuple[RunRecord, list[Trajectory]]) -> None:
    record, _ = run
    part = sorted((record.path / "rollouts").rglob("part-*.parquet"))[1]
    part.chmod(0o644)
    data = bytearray(part.read_bytes())
    data[len(data) // 3] ^= 0x10
    part.write_bytes(bytes(data))
    line = cli.error("runs", "rollouts", record.run_id)
    assert "is corrupt" in line and part.name in line


# -- a real run's records --------------------------------------------------------------------------


def real_episodes(run_id: str) -> list[Trajectory]:
    """Real episodes in real sandboxes: one answers, one waits on a tool that times out."""
    probe = pytest.importorskip("probe_tools")
    from reprorl.actions import render_call
    from reprorl.envs import EnvConfig
    from reprorl.envs.sandbox import SandboxPool
    from reprorl.rewards import VerifierRunner
    from reprorl.rollout import EpisodeIds, EpisodeLimits, ScriptedPolicy, run_episode
    from reprorl.types import Message, Role, Task

    task = Task(
        id="probe",
        family="probe",
        prompt=(Message(role=Role.USER, content="Find the secret."),),
        reference={"secret": "s3cr3t"},
    )
    scripts = {
        "answers": [render_call("write_file", {"path": "answer.txt", "content": "s3cr3t"}), "Done."],
        "times-out": [render_call("slow", {}), "I give up."],
    }

    async def play() -> list[Trajectory]:
        here = Path(__file__).resolve().parent
        out = []
        async with SandboxPool(["probe_tools"], sys_path=[here]) as pool, VerifierRunner(workers=1) as vr:
            for name, replies in scripts.items():

                def script(task: Task, messages: Any, replies: list[str] = replies) -> str:
                    turn = sum(1 for m in messages if m.role == Role.ASSISTANT)
                    return replies[turn] if turn < len(replies) else "I give up."

                out.append(
                    await run_episode(
                        probe.ProbeEnv(EnvConfig()),
                        task,
                        ScriptedPolicy(task, script),
                        verifier=probe.SecretVerifier(),
                        sandboxes=pool,
                        verifiers=vr,
                        ids=EpisodeIds(run_id, f"{run_id}/{name}"),
                        limits=EpisodeLimits(max_turns=4, wall_s=60),
                    )
                )
        return out

    return asyncio.run(play())


@pytest.mark.slow
def test_failed_rollouts_where_a_tool_timed_out_in_a_real_run(cli: Cli) -> None:
    record = new_run(cli.home)
    episodes = real_episodes(record.run_id)
    RolloutWriter(record).write(0, episodes)
    rows = cli.ok_json("runs", "rollouts", record.run_id, "--where", FAILED_WITH_TIMEOUT)
    assert [r["rollout_id"] for r in rows] == [f"{record.run_id}/times-out"]
    assert rows[0]["tool_outcomes"] == ["tool_timeout"]
    answered = cli.ok_json("runs", "rollouts", record.run_id, "--where", "reward_total = 1")
    assert [r["rollout_id"] for r in answered] == [f"{record.run_id}/answers"]
