"""Human labels: all-or-nothing imports, storage apart from judge scores, and judge/human agreement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reprorl.errors import RecordError, UserInputError
from reprorl.evaluation.judge import SCORES_FILE, JudgeScore, read_scores, write_scores
from reprorl.evaluation.labels import (
    LABELS_FILE,
    Agreement,
    Label,
    agreement,
    append_label,
    import_labels,
    latest_labels,
    read_labels,
)
from reprorl.hashing import content_hash
from reprorl.store import RunRecord, Store
from reprorl.store.rollouts import RolloutWriter
from rollout_records import KINDS, make


@pytest.fixture
def run(store: Store) -> RunRecord:
    spec = {"name": "labels-test"}
    record = RunRecord.create(
        store, spec=spec, spec_hash=content_hash(spec), name="labels", seeds={"root": 0}
    )
    RolloutWriter(record).write(0, [make(i, KINDS[i % len(KINDS)], record.run_id) for i in range(6)])
    return record


def rid(run: RunRecord, i: int) -> str:
    return f"{run.run_id}/r{i:04d}"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def label(
    rollout_id: str, value: str | float, reviewer: str = "ann", time: str = "2025-01-01T00:00:00Z"
) -> Label:
    return Label.model_validate(
        {"run_id": "r", "rollout_id": rollout_id, "label": value, "reviewer": reviewer, "time": time}
    )


def score(rollout_id: str, value: float | None, judge: str = "j@1") -> JudgeScore:
    return JudgeScore(
        run_id="r",
        rollout_id=rollout_id,
        judge=judge,
        judge_model="m",
        prompt_hash="sha256:p",
        request_hash="sha256:q",
        score=value,
        failure=None if value is not None else "parse_error",
        time="2025-01-01T00:00:00+00:00",
    )


def test_csv_import_fills_defaults_and_reads_back(run: RunRecord, tmp_path: Path) -> None:
    csv_file = write(
        tmp_path,
        "labels.csv",
        "\ufeffrollout_id, label ,reviewer,note,time\n"  # a spreadsheet's byte-order mark and spaces
        f"{rid(run, 0)},pass,,looks right,\n"
        f'{rid(run, 1)},FAIL,bob,"wrong, and rude",2025-02-03T04:05:06+01:00\n'
        f"{rid(run, 2)},0.7,,,\n"
        ",,,,\n",  # a blank row is not a label
    )
    imported = import_labels(run, csv_file, reviewer="ann")
    assert [(x.rollout_id, x.label, x.reviewer, x.note) for x in imported] == [
        (rid(run, 0), "pass", "ann", "looks right"),
        (rid(run, 1), "fail", "bob", "wrong, and rude"),
        (rid(run, 2), 0.7, "ann", ""),
    ]
    assert imported[1].time == "2025-02-03T03:05:06+00:00"  # normalised to UTC
    assert all(x.source == "import:labels.csv" and x.run_id == run.run_id for x in imported)
    assert read_labels(run) == imported
    assert [x.passed() for x in imported] == [True, False, True]


def test_jsonl_import_appends_to_what_is_there(run: RunRecord, tmp_path: Path) -> None:
    first = import_labels(
        run, write(tmp_path, "a.csv", f"rollout_id,label\n{rid(run, 0)},pass\n"), reviewer="ann"
    )
    rows = [
        {"rollout_id": rid(run, 3), "label": 0.25, "reviewer": "cy", "note": "partial"},
        {"rollout_id": rid(run, 0), "label": "fail", "reviewer": "ann", "time": "2030-01-01T00:00:00Z"},
    ]
    text = "\n".join(json.dumps(r) for r in rows) + "\n\n"
    second = import_labels(run, write(tmp_path, "b.jsonl", text))
    assert read_labels(run) == [*first, *second]
    newest = latest_labels(read_labels(run), reviewer="ann")
    assert newest[rid(run, 0)].label == "fail"  # a later label by the same reviewer supersedes


GOOD = "rollout_id,label,reviewer\n{r0},pass,ann\n{r1},fail,ann\n"


@pytest.mark.parametrize(
    ("name", "extra", "message"),
    [
        (
            "l.csv",
            "{r2},maybe,ann\n",
            "l.csv line 4, field label: 'maybe' is not pass, fail or a number from 0 to 1",
        ),
        ("l.csv", "{r2},1.5,ann\n", "l.csv line 4, field label: 1.5 is not pass, fail"),
        (
            "l.csv",
            "{r2},pass,\n",
            "l.csv line 4, field reviewer: missing; add a reviewer column or --reviewer NAME",
        ),
        ("l.csv", ",pass,ann\n", "l.csv line 4, field rollout_id: missing"),
        ("l.csv", "nope/r9,pass,ann\n", "l.csv line 4, field rollout_id: 'nope/r9' is not a rollout of run"),
        (
            "l.csv",
            "{r0},fail,ann\n",
            "l.csv line 4, field rollout_id: {r0} is labelled by ann again (first on line 2)",
        ),
        ("l.csv", "{r2},pass,ann,extra\n", "l.csv line 4: more cells than the header has columns"),
    ],
)
def test_a_bad_csv_row_is_one_line_naming_row_and_field_and_nothing_is_written(
    run: RunRecord, tmp_path: Path, name: str, extra: str, message: str
) -> None:
    import_labels(run, write(tmp_path, "before.csv", f"rollout_id,label\n{rid(run, 5)},pass\n"), reviewer="z")
    before = (run.path / LABELS_FILE).read_bytes()
    ids = {"r0": rid(run, 0), "r1": rid(run, 1), "r2": rid(run, 2)}
    path = write(tmp_path, name, (GOOD + extra).format(**ids))
    with pytest.raises(UserInputError) as caught:
        import_labels(run, path)
    assert str(caught.value).startswith(message.format(**ids))
    assert "\n" not in str(caught.value)
    assert (run.path / LABELS_FILE).read_bytes() == before  # the good rows before it were not written
    assert not list(run.path.glob(".tmp-*"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"rollout_id": "{r0}", "label": "pass", "reviewer": "a"}\n{"rollout_id": \n',
            "l.jsonl line 2: not valid JSON",
        ),
        (
            '{"rollout_id": "{r0}", "label": "pass", "reviewer": "a"}\n["x"]\n',
            "l.jsonl line 2: must be a JSON object",
        ),
        (
            '{"rollout_id": "{r0}", "label": true, "reviewer": "a"}\n',
            "l.jsonl line 1, field label: True is not pass",
        ),
        (
            '{"rollout_id": "{r0}", "label": "pass", "reviewer": 7}\n',
            "l.jsonl line 1, field reviewer: must be text",
        ),
        (
            '{"rollout_id": "{r0}", "label": "pass", "reviewer": "a", "time": "yesterday"}\n',
            "l.jsonl line 1, field time",
        ),
        (
            '{"rollout_id": "{r0}", "label": "pass", "reviewr": "a"}\n',
            "l.jsonl line 1: unknown field 'reviewr'",
        ),
        ("\n\n", "l.jsonl has no label rows"),
    ],
)
def test_a_bad_jsonl_row_is_one_line_and_nothing_is_written(
    run: RunRecord, tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, "l.jsonl", text.replace("{r0}", rid(run, 0)))
    with pytest.raises(UserInputError, match="^" + message.replace("(", r"\(")):
        import_labels(run, path)
    assert not (run.path / LABELS_FILE).exists()


def test_files_that_are_not_label_files(run: RunRecord, tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"^--import: .* is not a file"):
        import_labels(run, tmp_path / "missing.csv")
    with pytest.raises(UserInputError, match=r"unknown format '\.txt'; use \.csv or \.jsonl"):
        import_labels(run, write(tmp_path, "l.txt", "x"))
    (tmp_path / "latin.csv").write_bytes(b"rollout_id,label,note\nx,pass,caf\xe9\n")
    with pytest.raises(UserInputError, match="is not UTF-8"):
        import_labels(run, tmp_path / "latin.csv")


def test_labels_and_judge_scores_are_stored_apart(run: RunRecord, tmp_path: Path) -> None:
    scores = [score(rid(run, i), 0.9).model_copy(update={"run_id": run.run_id}) for i in range(2)]
    write_scores(run, scores)
    scores_bytes = (run.path / SCORES_FILE).read_bytes()
    import_labels(run, write(tmp_path, "l.csv", f"rollout_id,label\n{rid(run, 0)},fail\n"), reviewer="ann")
    append_label(run, label(rid(run, 1), "pass").model_copy(update={"run_id": run.run_id}))
    assert (run.path / SCORES_FILE).read_bytes() == scores_bytes  # a label never touches the judge's file
    labels_bytes = (run.path / LABELS_FILE).read_bytes()
    write_scores(run, [scores[0].model_copy(update={"score": 0.1})])
    assert (run.path / LABELS_FILE).read_bytes() == labels_bytes  # and a score never touches the labels
    assert [x.label for x in read_labels(run)] == ["fail", "pass"]
    assert sorted(s.score for s in read_scores(run) if s.score is not None) == [0.1, 0.9]
    assert b'"judge"' not in labels_bytes and b'"reviewer"' not in scores_bytes


def test_a_torn_last_label_line_is_skipped_and_a_damaged_one_is_an_error(run: RunRecord) -> None:
    for i in range(2):
        append_label(run, label(rid(run, i), "pass").model_copy(update={"run_id": run.run_id}))
    path = run.path / LABELS_FILE
    with path.open("ab") as handle:
        handle.write(b'{"sha": "12", "rec": {"rollo')  # a crash in the middle of an append
    assert len(read_labels(run)) == 2
    append_label(run, label(rid(run, 2), "fail").model_copy(update={"run_id": run.run_id}))
    assert len(read_labels(run)) == 3
    path.write_bytes(path.read_bytes().replace(b'"pass"', b'"fail"', 1))
    with pytest.raises(RecordError, match="line 1 was edited"):
        read_labels(run)
    with pytest.raises(RecordError, match="belongs to run"):
        append_label(run, label(rid(run, 3), "pass"))


def test_kappa_and_percent_agreement_match_a_hand_computation() -> None:
    # judge \ human   pass  fail
    #   pass            4     2
    #   fail            1     3          n = 10, p_o = 7/10
    # p_e = P(judge pass) P(human pass) + P(judge fail) P(human fail) = .6 * .5 + .4 * .5 = .5
    # kappa = (.7 - .5) / (1 - .5) = 0.4
    cells = [(0.9, "pass")] * 4 + [(0.5, 0.2)] * 2 + [(0.49, 1.0)] + [(0.0, "fail")] * 3
    scores = [score(f"x{i}", j) for i, (j, _) in enumerate(cells)]
    labels = [label(f"x{i}", h) for i, (_, h) in enumerate(cells)]
    # Left out: a failed judgement, an unlabelled rollout, and a superseded label.
    scores += [score("failed", None), score("unlabelled", 0.9)]
    labels += [label("failed", "pass"), label("x0", "fail", time="2024-01-01T00:00:00Z")]
    result = agreement(scores, labels)
    assert (result.n, result.both_pass, result.both_fail, result.judge_only_pass, result.human_only_pass) == (
        10,
        4,
        3,
        2,
        1,
    )
    assert result.percent == pytest.approx(70.0) and result.kappa == pytest.approx(0.4)
    assert result.to_json()["kappa"] == pytest.approx(0.4) and result.judge == "j@1"


def test_agreement_edge_cases() -> None:
    perfect = agreement([score("a", 1.0), score("b", 0.0)], [label("a", "pass"), label("b", "fail")])
    assert perfect.percent == 100.0 and perfect.kappa == pytest.approx(1.0)
    one_class = agreement([score("a", 1.0)], [label("a", "pass")])
    assert one_class.percent == 100.0 and one_class.kappa is None  # p_e = 1: kappa is undefined
    empty = agreement([], [])
    assert empty == Agreement("", None, 0.5, 0, 0, 0, 0) and empty.percent is None and empty.kappa is None
    two_judges = [score("a", 1.0, "j@1"), score("a", 0.0, "j@2")]
    with pytest.raises(UserInputError, match=r"^judge: scores come from several judges \(j@1, j@2\)"):
        agreement(two_judges, [label("a", "pass")])
    assert agreement(two_judges, [label("a", "pass")], judge="j@2").human_only_pass == 1
    by_reviewer = [label("a", "pass", "ann"), label("a", "fail", "bob", time="2026-01-01T00:00:00Z")]
    assert agreement([score("a", 1.0)], by_reviewer, reviewer="ann").both_pass == 1
    assert agreement([score("a", 1.0)], by_reviewer).judge_only_pass == 1  # newest label, whoever gave it
    assert agreement([score("a", 0.3)], [label("a", 0.3)], threshold=0.25).both_pass == 1
