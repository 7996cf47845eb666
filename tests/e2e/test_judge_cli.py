"""`reprorl rewards judge` end to end: a judge served over HTTP scores a sampled run's rollouts into the run's
scores file, answers again from its cache, and is then held against human labels."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from cli_support import Cli, run_ids, tiny_training_store

from judge_server import Prompt, app, serve, verdict
from reprorl.evaluation.judge import final_answer, read_scores, task_text
from reprorl.evaluation.labels import import_labels
from reprorl.orchestrate.jobs.judge_run import run_tasks
from reprorl.store import RunRecord
from reprorl.store.rollout_query import RolloutStore

pytestmark = pytest.mark.slow

SPEC = """
name = "tiny-judged-sample"
seed = 5
[model]
owner = "t@x"
base = "tiny"
[data]
owner = "t@x"
train = "calc-train"
[learning]
owner = "t@x"
group_size = 3
tasks_per_step = 2
max_tokens = 12
max_turns = 2
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
"""


def expected(answer: str) -> float:
    return (len(answer) % 3) / 2


class Graded:
    """Scores by the answer's length; counts requests and remembers the tasks it was shown."""

    def __init__(self) -> None:
        self.calls = 0
        self.tasks: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, prompt: Prompt) -> str:
        with self._lock:
            self.calls += 1
            self.tasks.add(prompt.task)
        return verdict(expected(prompt.answer), "by length")


def test_a_judge_scores_a_stored_run_then_meets_the_labels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tiny_training_store(tmp_path)
    home = tmp_path / "home"
    cli = Cli(home, capsys)
    (tmp_path / "spec.toml").write_text(SPEC)
    code, _, err = cli("sample", str(tmp_path / "spec.toml"), "--steps", "2", "--no-progress")
    assert code == 0, err
    (run_id,) = run_ids(home)
    record = RunRecord(store, run_id)
    trajectories = [t for t in RolloutStore(record).trajectories() if not t.retried]
    assert len(trajectories) == 12
    grade = Graded()
    with serve(app(grade)) as url:
        judge_file = tmp_path / "judge.toml"
        judge_file.write_text(f'base_url = "{url}"\nmodel = "by-length"\nretries = 0\n')

        first = cli.ok_json("rewards", "judge", run_id, "--judge", str(judge_file), "--limit", "5")
        assert (first["selected"], first["judged"], first["requests"], first["cache_hits"]) == (5, 5, 5, 0)
        assert first["audit"] is None and first["no_task"] == 0

        # All of them: the five already judged come from the cache; every prompt held its real task.
        full = cli.ok_json("rewards", "judge", run_id, "--judge", str(judge_file))
        assert (full["selected"], full["judged"], full["requests"], full["cache_hits"]) == (12, 12, 7, 5)
        tasks = run_tasks(store, record)
        assert grade.calls == 12 and grade.tasks == {task_text(tasks[t.task_id]) for t in trajectories}
        scores = {s.rollout_id: s for s in read_scores(record)}
        assert set(scores) == {t.rollout_id for t in trajectories}
        for trajectory in trajectories:
            assert scores[trajectory.rollout_id].score == expected(final_answer(trajectory))
        assert full["passed"] == sum(expected(final_answer(t)) >= 0.5 for t in trajectories)

        # A condition narrows the selection; a bad one is one line naming the flag's field.
        step0 = cli.ok_json("rewards", "judge", run_id, "--judge", str(judge_file), "--where", "step = 0")
        assert (step0["selected"], step0["requests"]) == (6, 0)
        assert cli.error(
            "rewards", "judge", run_id, "--judge", str(judge_file), "--where", "nope = 1"
        ).startswith("error: where: ")
        assert "judge.toml" in cli.error(
            "rewards", "judge", run_id, "--judge", str(tmp_path / "judge.toml.missing")
        )

        code, out, err = cli("rewards", "judge", run_id, "--judge", str(judge_file))
        assert code == 0, err
        flat = " ".join(out.split())
        assert (
            f"12 of 12 rollouts scored, {full['passed']} passed" in flat
            and "12 answered from the cache" in flat
        )
        assert "no robustness audit" in flat and f"reprorl rewards errors {run_id}" in flat

    # A person labels every rollout as the judge scored it, but one: the judge's one false positive.
    judged_pass = [t.rollout_id for t in trajectories if expected(final_answer(t)) >= 0.5]
    assert judged_pass, "the tiny model's answers all scored below 0.5"
    labels = tmp_path / "labels.csv"
    rows = [f"{t.rollout_id},{'pass' if t.rollout_id in judged_pass[1:] else 'fail'}" for t in trajectories]
    labels.write_text("rollout_id,label\n" + "\n".join(rows) + "\n")
    import_labels(record, labels, reviewer="ann")
    out = cli.ok_json("rewards", "errors", run_id)
    (judge,) = [s for s in out["scorers"] if s["scorer"].startswith("judge/by-length@")]
    assert (judge["fp"], judge["fn"], judge["n"]) == (1, 0, 12)
