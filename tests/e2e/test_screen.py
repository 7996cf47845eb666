"""`reprorl tasks screen` on a planted task set: too-easy, impossible, trainable and leaky tasks each land
in their class, only the trainable ones are registered (with lineage), a verifier that disagrees
with itself is caught, and a killed screen resumes without screening a task twice."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from cli_support import Cli, run_ids, tiny_home
from planted_verifiers import Alternating

from reprorl.config.screen import ScreenSpec
from reprorl.envs.common import impossible_variant
from reprorl.envs.families import files
from reprorl.hashing import sha256_hex
from reprorl.orchestrate.jobs.screen import ScriptedScreenPolicy, screen
from reprorl.rollout.episode import Policy, ScriptedPolicy
from reprorl.rollout.families import FAMILIES
from reprorl.rollout.runner import RolloutJob
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import Message, Split, Task, TaskSet

pytestmark = pytest.mark.slow

K = 8
# What the planted policy does on each kind of task: the chance that it solves an attempt.
SOLVES = {"easy": 1.0, "impossible": 1.0, "mid": 0.5, "leaky": 0.5}
LEAK = "notes/expected_answer.txt"
CLI = "import sys; from reprorl.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _planted_tasks() -> list[Task]:
    answers = [
        t
        for t in files.generate(3, train=0, eval=40, holdout=0)[Split.EVAL].tasks
        if isinstance(t.reference, dict) and t.reference["kind"] == "answer"
    ]
    planted = []
    for i, task in enumerate(answers[:8]):
        kind = ("easy", "impossible", "mid", "leaky")[i % 4]
        if kind == "impossible":
            task = impossible_variant(task)
        if kind == "leaky":
            # The reference sits in the workspace the agent can read.
            assert isinstance(task.reference, dict) and isinstance(task.setup, dict)
            leak = f"{task.reference['answer']}\n"
            task = task.model_copy(
                update={
                    "setup": {"files": {**task.setup["files"], LEAK: leak}},
                    "reference": {
                        **task.reference,
                        "files": {**task.reference["files"], LEAK: sha256_hex(leak.encode())},
                    },
                }
            )
        planted.append(task.model_copy(update={"id": f"{kind}-{i}"}))
    return planted


def _planted_policy(job: RolloutJob, rollout_id: str) -> Policy:
    """The oracle's work on a seeded share of attempts; on the others, no answer."""
    solves = random.Random(job.seed).random() < SOLVES[job.task.id.split("-")[0]]

    def gives_up(task: Task, messages: Sequence[Message]) -> str:
        return "I could not work it out."

    return ScriptedPolicy(job.task, files.oracle if solves else gives_up, name="planted")


def test_planted_tasks_land_in_their_classes_and_only_trainable_ones_are_registered(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    tasks = _planted_tasks()
    screened = store.add_bytes(
        "planted", TaskSet(name="planted", tasks=tuple(tasks)).to_jsonl(), kind="taskset"
    )
    spec = ScreenSpec(taskset=screened.ref, policy="script:planted", k=K, chunk=3, replays=2)
    record, report = asyncio.run(
        screen(store, spec, scripted=ScriptedScreenPolicy("planted", _planted_policy))
    )
    verdicts = {t.task_id: t.verdict for t in report.tasks}
    expected = {"easy": "too_easy", "impossible": "no_signal", "mid": "trainable", "leaky": "suspect"}
    assert verdicts == {t.id: expected[t.id.split("-")[0]] for t in tasks}
    for t in report.by_class("suspect"):
        assert "read_reference" in t.probe_hits and 0 < t.passes < K
    for t in report.by_class("trainable"):
        assert 0 < t.passes < K and t.scored == K and t.replay_outcomes  # replayed, and consistent
    assert report.counts() == {
        "trainable": 2,
        "too_easy": 2,
        "no_signal": 2,
        "flaky": 0,
        "suspect": 2,
        "unscored": 0,
    }
    assert sum(n for _, n in report.histogram()) == len(tasks)
    # The new version holds exactly the trainable tasks, and its lineage names what made it.
    assert report.new_version == "planted@v2"
    new = store.registry.newest("planted")
    subset = TaskSet.from_jsonl("planted", store.read(new.ref))
    assert sorted(t.id for t in subset.tasks) == sorted(t.task_id for t in report.trainable())
    assert new.meta["screened_from"] == screened.hash and new.meta["screen_run"] == record.run_id
    assert (
        new.meta["screen_spec_hash"]
        == spec.spec_hash()
        == RunRecord(store, record.run_id).info()["spec_hash"]
    )
    assert "screened_from" in {rel for _, rel, _ in _parents(store, new.hash, screened.hash)}
    # Every attempt, replay and probe episode is on record.
    ids = [t.rollout_id for t in RolloutStore(record).trajectories()]
    assert len(ids) == len(set(ids)) == len(tasks) * (K + 2 + 7)


def _parents(store: Store, child: str, parent: str) -> list[tuple[str, str, str | None]]:
    return [p for p in store.registry.parents(child) if p[0] == parent]


def test_a_verifier_that_disagrees_with_itself_makes_its_task_flaky(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    calculator = FAMILIES["calculator"]
    task = calculator.generate(0, train=0, eval=1, holdout=0)[Split.EVAL].tasks[0]
    version = store.add_bytes("one", TaskSet(name="one", tasks=(task,)).to_jsonl(), kind="taskset")
    families = {"calculator": dataclasses.replace(calculator, verifier=Alternating(str(tmp_path / "count")))}
    spec = ScreenSpec(taskset=version.ref, policy="oracle", k=2, replays=2, probes=False)
    _, report = asyncio.run(screen(store, spec, families=families))
    (only,) = report.tasks
    assert only.verdict == "flaky" and len(set(only.replay_outcomes[0])) == 2
    assert report.new_version is None  # nothing trainable, nothing registered


def test_a_killed_screen_resumes_without_screening_a_task_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tiny_home(tmp_path, "home")
    args = ["tasks", "screen", "calc-eval", "--policy", "oracle", "-k", "2", "--chunk", "4", "--replays", "0"]
    reference = Cli(tiny_home(tmp_path, "ref"), capsys).ok_json(*args)
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "--home", str(home), *args, "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        runs = run_ids(home)
        metrics = home / "runs" / runs[0] / "metrics.jsonl" if runs else None
        if metrics is not None and metrics.exists() and metrics.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (run,) = run_ids(home)
    record = RunRecord(Store(home), run)
    chunks_before = record.metrics().records
    assert 2 <= len(chunks_before) < 8, "the kill landed mid-screen"
    resumed = Cli(home, capsys).ok_json("tasks", "screen", "--resume", run)
    assert resumed["counts"] == reference["counts"]
    assert [t["task_id"] for t in resumed["tasks"]] == [t["task_id"] for t in reference["tasks"]]
    lines = RunRecord(Store(home), run).metrics().records
    assert sorted(m["step"] for m in lines) == list(range(8))  # each chunk once
    ids = [t.rollout_id for t in RolloutStore(RunRecord(Store(home), run)).trajectories()]
    assert len(ids) == len(set(ids)) == 32 * 2 + 32 * 7


def test_a_screen_resumed_over_damaged_records_screens_those_chunks_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tiny_home(tmp_path, "home")
    args = ["tasks", "screen", "calc-eval", "--policy", "oracle", "-k", "2", "--chunk", "4", "--replays", "0"]
    cli = Cli(home, capsys)
    reference = cli.ok_json(*args)
    (run,) = run_ids(home)
    record = RunRecord(Store(home), run)
    before = sorted(t.rollout_id for t in RolloutStore(record).trajectories())
    part = sorted((record.path / "rollouts" / "step=000001").glob("part-*.parquet"))[0]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x04
    part.write_bytes(bytes(data))
    metrics = record.path / "metrics.jsonl"
    lines = metrics.read_bytes().splitlines(keepends=True)
    line = bytearray(lines[5])
    line[line.index(b'"tasks"') + 9] ^= 0x02  # a digit of one chunk's task count
    lines[5] = bytes(line)
    metrics.write_bytes(b"".join(lines))

    resumed = cli.ok_json("tasks", "screen", "--resume", run)
    assert resumed["counts"] == reference["counts"]
    record = RunRecord(Store(home), run)
    assert record.metrics().bad_lines == []
    assert sorted(m["step"] for m in record.metrics().records) == list(range(8))  # each chunk once
    assert sorted(t.rollout_id for t in RolloutStore(record).trajectories()) == before
    (found,) = [e for e in record.events().records if e["event"] == "records_damaged"]
    assert found["parts"] == [part.relative_to(record.path).as_posix()] and found["metrics_line"] == 6
