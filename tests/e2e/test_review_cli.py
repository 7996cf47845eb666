"""`reprorl rewards review` end to end: labels from piped stdin, imports, judge agreement, one-line errors."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from cli_support import Cli

from reprorl.config import load_spec
from reprorl.evaluation.judge import JudgeScore, write_scores
from reprorl.evaluation.labels import LABELS_FILE, Label, read_labels
from reprorl.store import RunRecord, Store
from reprorl.store.rollouts import RolloutWriter
from reprorl.types import TaskSet
from rollout_records import KINDS, judge_score, make

SPEC = """
name = "review-e2e"
seed = 3
[model]
owner = "t@x"
base = "tiny"
[data]
owner = "t@x"
train = "calc-train"
[learning]
owner = "t@x"
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
"""


@pytest.fixture
def run(cli: Cli, tmp_path: Path) -> RunRecord:
    """A run with a real spec and task sets, and six rollouts: r0000 ran a real eval task."""
    store = Store(cli.home)
    try:
        (tmp_path / "weights.bin").write_bytes(b"not a model: only its hash is needed")
        store.add("tiny", tmp_path / "weights.bin", kind="model")
        examples = resources.files("reprorl") / "examples"
        for name in ("calc-train", "calc-eval"):
            with resources.as_file(examples / f"{name}.jsonl") as path:
                store.add(name, path, kind="taskset")
        (tmp_path / "spec.toml").write_text(SPEC)
        spec = load_spec(tmp_path / "spec.toml", pin_bare=store.pin_newest)
        record = RunRecord.create(
            store,
            spec=spec.model_dump(mode="json"),
            spec_hash=spec.spec_hash(),
            name=spec.name,
            seeds={"root": 3},
        )
        task = TaskSet.from_jsonl("calc-eval", store.read(str(spec.evaluation.suites[0]))).tasks[0]
    finally:
        store.close()
    rollouts = [make(i, KINDS[i], record.run_id) for i in range(6)]
    rollouts[0] = rollouts[0].model_copy(update={"task_id": task.id, "task_hash": task.content_hash})
    RolloutWriter(record).write(0, rollouts)
    return record


def rid(run: RunRecord, i: int) -> str:
    return f"{run.run_id}/r{i:04d}"


def review(cli: Cli, monkeypatch: pytest.MonkeyPatch, typed: str, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(typed))
    return cli("rewards", "review", *args)


def labels(run: RunRecord) -> list[Label]:
    return read_labels(run)


def test_help(cli: Cli) -> None:
    code, out, _ = cli("rewards", "review", "--help")
    assert code == 0 and all(flag in out for flag in ("--import", "--reviewer", "--limit", "--split"))


def test_labelling_turn_by_turn_from_piped_stdin(
    cli: Cli, run: RunRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    # r0000: Enter shows turn 2, then pass with a note; r0001: a typo, then fail; r0002: skip; then EOF.
    code, out, err = review(cli, monkeypatch, "\np fine work\nmaybe\nf\ns\n", run.run_id, "--reviewer", "ann")
    assert code == 0, err
    assert "rollout 1/6" in out and "A library had 929 books" in out  # the task prompt, from the eval suite
    assert "turn 1/2" in out and "turn 2/2" in out and "tool calculator (ok): 4" in out
    assert "not understood: 'maybe'" in out and "turn 3/3" not in out  # skipped at its first turn
    assert "labelled 2 (1 pass, 1 fail, 0 scored), skipped 1" in out
    stored = labels(run)
    assert [(x.rollout_id, x.label, x.note, x.reviewer, x.source) for x in stored] == [
        (rid(run, 0), "pass", "fine work", "ann", "review"),
        (rid(run, 1), "fail", "", "ann", "review"),
    ]
    # The next session starts where this reviewer left off: skipped and unseen rollouts only.
    code, out, err = review(
        cli, monkeypatch, "\n\n\n0.8 partly\nq\n", run.run_id, "--reviewer", "ann", "--limit", "2"
    )
    assert code == 0, err
    assert "rollout 1/2" in out and rid(run, 2) in out and rid(run, 0) not in out
    assert "that was the last turn" in out and "labelled 1 (0 pass, 0 fail, 1 scored), skipped 0" in out
    assert [(x.rollout_id, x.label, x.note) for x in labels(run)][-1] == (rid(run, 2), 0.8, "partly")
    # Another reviewer sees everything again; --split keeps only that split.
    code, out, err = review(cli, monkeypatch, "p\np\n", run.run_id, "--reviewer", "bob", "--split", "EVAL")
    assert code == 0, err
    assert [x.rollout_id for x in labels(run) if x.reviewer == "bob"] == [rid(run, 0), rid(run, 5)]
    code, out, _ = review(cli, monkeypatch, "", run.run_id, "--reviewer", "bob", "--split", "eval")
    assert code == 0 and "nothing to review: bob has labelled every matching rollout" in out


def test_a_rollout_with_no_turns_is_still_shown(
    cli: Cli, run: RunRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    typed = "s\ns\ns\nf infra\n"
    code, out, err = review(cli, monkeypatch, typed, run.run_id, "--reviewer", "cy", "--limit", "4")
    assert code == 0, err
    assert "(no turns) error: ConnectionError: policy server unreachable" in out
    assert "task: (prompt not found in the run's task sets)" in out  # r0001..: tasks not in the suites
    assert [(x.rollout_id, x.note) for x in labels(run)] == [(rid(run, 3), "infra")]


def judged(run: RunRecord, i: int, score: float) -> JudgeScore:
    return judge_score(run.run_id, rid(run, i), score, n=i)


def test_import_then_agreement_with_the_judge(cli: Cli, run: RunRecord, tmp_path: Path) -> None:
    verdicts = {0: 0.9, 1: 0.1, 2: 0.8}
    write_scores(run, [judged(run, i, value) for i, value in verdicts.items()])
    path = tmp_path / "labels.csv"
    path.write_text(
        f"rollout_id,label,note\n{rid(run, 0)},pass,\n{rid(run, 1)},fail,\n{rid(run, 2)},fail,too slow\n"
    )
    code, out, err = cli("rewards", "review", run.run_id, "--import", str(path), "--reviewer", "ann")
    assert code == 0, err
    assert f"imported 3 labels into {run.path / LABELS_FILE}" in out
    # 2 of 3 agree; p_e = 2/3 * 1/3 + 1/3 * 2/3 = 4/9; kappa = (2/3 - 4/9) / (5/9) = 0.4
    assert "judge judge-model@abc vs ann: 66.7% agree, Cohen's kappa 0.40 (n=3)" in out


def test_flagged_shows_only_what_the_scorers_disagree_on_and_why(
    cli: Cli, run: RunRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The verifier passes r0000 and r0002 (outcome 1) and fails the rest; the judge fails r0000 and
    # passes r0004: those two are flagged, the agreeing r0001 and r0002 are not.
    write_scores(run, [judged(run, i, score) for i, score in {0: 0.1, 1: 0.1, 2: 0.9, 4: 0.8}.items()])
    code, out, err = review(cli, monkeypatch, "f\n", run.run_id, "--reviewer", "ann", "--flagged")
    assert code == 0, err
    assert "rollout 1/2" in out and rid(run, 0) in out and rid(run, 1) not in out
    assert "flagged: verifier passed, judge/judge-model@abc failed" in " ".join(out.split())
    code, out, err = review(cli, monkeypatch, "p\n", run.run_id, "--reviewer", "ann", "--flagged")
    assert code == 0, err
    assert "rollout 1/1" in out and rid(run, 4) in out
    assert "flagged: judge/judge-model@abc passed, verifier failed" in " ".join(out.split())
    assert [(x.rollout_id, x.label) for x in labels(run)] == [(rid(run, 0), "fail"), (rid(run, 4), "pass")]
    code, out, _ = review(cli, monkeypatch, "", run.run_id, "--reviewer", "ann", "--flagged")
    assert code == 0 and "labelled every matching flagged rollout" in out


def test_bad_input_is_one_line_and_writes_nothing(cli: Cli, run: RunRecord, tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(f"rollout_id,label,reviewer\n{rid(run, 0)},pass,ann\n{rid(run, 1)},perhaps,ann\n")
    line = cli.error("rewards", "review", run.run_id, "--import", str(bad))
    assert line.startswith("error: bad.csv line 3, field label: 'perhaps' is not pass, fail or a number")
    assert not (run.path / LABELS_FILE).exists()
    assert "--reviewer: name who is reviewing" in cli.error("rewards", "review", run.run_id)
    assert "--split: 'dev' is not a split; use one of train, eval, holdout" in cli.error(
        "rewards", "review", run.run_id, "--reviewer", "ann", "--split", "dev"
    )
    assert "--limit, --split and --flagged" in cli.error(
        "rewards", "review", run.run_id, "--import", str(bad), "--limit", "3"
    )
    assert "no run matches 'nope'" in cli.error("rewards", "review", "nope", "--reviewer", "ann")


def test_the_installed_command_reads_a_real_pipe(cli: Cli, run: RunRecord) -> None:
    exe = shutil.which("reprorl", path=str(Path(sys.executable).parent))
    assert exe is not None, "the reprorl console script is not installed in this environment"
    done = subprocess.run(
        [exe, "--home", str(cli.home), "rewards", "review", run.run_id, "--reviewer", "dee", "--limit", "2"],
        input="f piped\n",  # then end of input: the session stops and keeps what was saved
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "labelled 1 (0 pass, 1 fail, 0 scored), skipped 0" in done.stdout
    assert [(x.rollout_id, x.label, x.note, x.reviewer) for x in labels(run)] == [
        (rid(run, 0), "fail", "piped", "dee")
    ]
