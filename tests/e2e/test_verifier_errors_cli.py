"""`reprorl rewards errors` end to end: planted verifier errors found in a recorded run's labels."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import Cli

from reprorl.evaluation.judge import write_scores
from reprorl.evaluation.labels import import_labels
from reprorl.evaluation.stats import proportion_ci
from reprorl.hashing import content_hash
from reprorl.store import RunRecord, Store
from reprorl.store.rollouts import RolloutWriter
from reprorl.types import Reward, Trajectory
from rollout_records import judge_score, make

# Rollouts 0-11 are scored. The verifier passes 0-6 and fails 7-11; ann says 0-3 pass and 4-5 fail
# (two false positives), 7-9 fail and 10 pass (one false negative); 6 and 11 are unlabelled.
VERIFIER_PASSES = range(0, 7)
ANN = {0: "pass", 1: "pass", 2: "pass", 3: "pass", 4: "fail", 5: "fail", 7: "fail", 8: "fail", 9: "fail"}
ANN[10] = "pass"
RETRIED, UNREWARDED = 12, 13  # labelled too, but no scorer judged them: never counted


def rid(run: RunRecord, i: int) -> str:
    return f"{run.run_id}/r{i:04d}"


def rollout(run_id: str, i: int) -> Trajectory:
    passed = i in VERIFIER_PASSES or i == RETRIED
    # The second verifier agrees with the humans where they labelled, and with the verifier elsewhere.
    cross = 1.0 if ANN.get(i, "pass" if passed else "fail") == "pass" else 0.0
    outcome = 1.0 if passed else 0.0
    reward = Reward(
        total=outcome, components={"outcome": outcome, "cross/sql": cross}, verifier_version="sha256:v1"
    )
    return make(i, "answered", run_id).model_copy(
        update={"reward": None if i == UNREWARDED else reward, "retried": i == RETRIED}
    )


@pytest.fixture
def store(cli: Cli) -> Store:
    return Store(cli.home)


def new_run(store: Store, name: str, n: int) -> RunRecord:
    spec = {"name": name}
    record = RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name=name, seeds={"root": 0})
    RolloutWriter(record).write(0, [rollout(record.run_id, i) for i in range(n)])
    return record


@pytest.fixture
def run(store: Store, tmp_path: Path) -> RunRecord:
    record = new_run(store, "verifier-errors-e2e", 14)
    ann = tmp_path / "ann.csv"
    rows = [f"{rid(record, i)},{value}" for i, value in ANN.items()]
    rows += [f"{rid(record, RETRIED)},fail", f"{rid(record, UNREWARDED)},pass"]
    ann.write_text("rollout_id,label\n" + "\n".join(rows) + "\n")
    import_labels(record, ann, reviewer="ann")
    # Bob labelled two of the same rollouts long before ann did: the newest label per rollout is hers.
    bob = tmp_path / "bob.jsonl"
    bob.write_text(
        "\n".join(
            f'{{"rollout_id": "{rid(record, i)}", "label": "pass", "time": "2020-01-01T00:00:00Z"}}'
            for i in (4, 7)
        )
        + "\n"
    )
    import_labels(record, bob, reviewer="bob")
    write_scores(
        record,
        [
            # Passes 4, which ann failed: one false positive.
            judge_score(record.run_id, rid(record, i), 0.9 if i < 5 else 0.1, n=i)
            for i in range(12)
        ],
    )
    store.close()
    return record


def rate(successes: int, n: int) -> dict[str, object]:
    ci = proportion_ci(successes, n)
    return {"value": ci.value, "low": ci.low, "high": ci.high, "n": n, "confidence": 0.95, "method": "wilson"}


def test_planted_false_positives_and_negatives_are_reported_with_intervals(cli: Cli, run: RunRecord) -> None:
    out = cli.ok_json("rewards", "errors", run.run_id)
    assert (out["run_id"], out["reviewer"], out["rollouts"], out["labelled"]) == (run.run_id, None, 12, 10)
    scorers = {s["scorer"]: s for s in out["scorers"]}
    assert list(scorers) == ["verifier", "cross/sql", "judge/judge-model@abc"]
    verifier = scorers["verifier"]
    assert verifier["versions"] == ["sha256:v1"] and verifier["scored"] == 12
    assert (verifier["tp"], verifier["fp"], verifier["tn"], verifier["fn"]) == (4, 2, 3, 1)
    assert verifier["fp_rate"] == rate(2, 5)  # passed 2 of the 5 rollouts ann failed
    assert verifier["fn_rate"] == rate(1, 5)  # failed 1 of the 5 rollouts ann passed
    assert verifier["precision"] == rate(4, 6)
    cross = scorers["cross/sql"]
    assert (cross["fp"], cross["fn"], cross["fp_rate"], cross["fn_rate"]) == (0, 0, rate(0, 5), rate(0, 5))
    judge = scorers["judge/judge-model@abc"]
    assert (judge["tp"], judge["fp"], judge["tn"], judge["fn"]) == (4, 1, 4, 1)
    pairs = {d["b"]: d for d in out["disagreements"]}
    assert pairs["cross/sql"]["flagged"] == [rid(run, 4), rid(run, 5), rid(run, 10)]
    assert pairs["cross/sql"]["rate"] == rate(3, 12)
    assert pairs["judge/judge-model@abc"]["flagged"] == [rid(run, 5), rid(run, 6)]


def test_one_reviewer_only(cli: Cli, run: RunRecord) -> None:
    out = cli.ok_json("rewards", "errors", run.run_id, "--reviewer", "bob")
    verifier = out["scorers"][0]
    assert (out["reviewer"], out["labelled"]) == ("bob", 2)
    assert (verifier["tp"], verifier["fp"], verifier["tn"], verifier["fn"]) == (1, 0, 0, 1)
    assert verifier["fp_rate"] is None  # bob failed nothing: the rate is undefined, not 0
    assert verifier["fn_rate"] == rate(1, 2)


def test_plain_output(cli: Cli, run: RunRecord) -> None:
    code, out, err = cli("rewards", "errors", run.run_id[:14])
    assert code == 0, err
    assert "10 of 12 labelled" in out and "verifier (sha256:v1)" in out
    assert f"{2 / 5:.3f} [{proportion_ci(2, 5).low:.2f}, {proportion_ci(2, 5).high:.2f}]" in out
    assert "Wilson 95%" in out
    assert "r0004, r0005, r0010" in out  # flagged by cross/sql, shown without the run id


def test_a_run_without_labels_still_shows_disagreement(cli: Cli, store: Store) -> None:
    record = new_run(store, "unlabelled", 12)
    store.close()
    code, out, err = cli("rewards", "errors", record.run_id)
    assert code == 0, err
    assert f"no human labels on the 12 scored rollouts of run {record.run_id}" in out
    assert "disagreement with the verifier" in out and "cross/sql" in out
    out_json = cli.ok_json("rewards", "errors", record.run_id)
    assert out_json["labelled"] == 0 and out_json["scorers"][0]["fp_rate"] is None


def test_an_unknown_run_is_one_line(cli: Cli, run: RunRecord) -> None:
    assert "no run matches 'nope'" in cli.error("rewards", "errors", "nope")
