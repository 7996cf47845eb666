"""Train-vs-held-out leakage: exact copies under new ids, near-duplicate prompts, and no false alarms."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable
from importlib import resources

import pytest
from pydantic import JsonValue

from reprorl.envs.families import calculator, files, sql
from reprorl.evaluation.leakage import Leak, LeakageReport, check_leakage, shingles, task_identity
from reprorl.types import Message, Role, Split, Task, TaskSet

LONG = (
    "A warehouse keeps its inventory in three rooms and every morning the clerk counts the boxes "
    "in each room before the trucks arrive from the northern depot with fresh supplies for the "
    "week ahead. How many boxes are there after the second delivery? Answer with a number."
)


def task(
    task_id: str,
    text: str,
    *,
    split: Split = Split.TRAIN,
    setup: JsonValue = None,
    reference: JsonValue = None,
    tags: tuple[str, ...] = (),
) -> Task:
    return Task(
        id=task_id,
        family="test",
        prompt=(Message(role=Role.USER, content=text),),
        split=split,
        setup=setup,
        reference=reference,
        tags=tags,
    )


def near_pairs(report: LeakageReport) -> set[tuple[str, str]]:
    return {(leak.train_id, leak.held_id) for leak in report.leaks if leak.kind == "near_duplicate"}


# --------------------------------------------------------------------------- exact


def test_same_task_under_a_new_id_split_and_tags_is_an_exact_leak() -> None:
    original = task("calc-train-0011", LONG, reference={"answer": 7}, tags=("required",))
    copy = original.model_copy(update={"id": "calc-eval-0003", "split": Split.EVAL, "tags": ()})
    other = task("calc-train-0012", "What is two plus two? Answer with a number.")

    report = check_leakage([other, original], {"eval": [copy]})

    assert not report.ok
    assert report.leaks == (Leak("calc-train-0011", "calc-eval-0003", "eval", "exact", 1.0),)
    assert report.summary() == (
        "leak: 1 eval task matches train tasks: calc-eval-0003 = calc-train-0011 (exact)"
    )


def test_identity_ignores_labels_but_not_content() -> None:
    base = task("a", LONG, reference={"answer": 7})
    relabelled = base.model_copy(update={"id": "b", "split": Split.HOLDOUT, "tags": ("required",)})
    assert task_identity(base) == task_identity(relabelled)
    assert task_identity(base) != task_identity(base.model_copy(update={"reference": {"answer": 8}}))
    assert task_identity(base) != task_identity(base.model_copy(update={"difficulty": 2}))


def test_same_prompt_and_setup_with_another_reference_is_a_near_duplicate_not_exact() -> None:
    train = task("t", LONG, reference={"answer": 7})
    held = task("h", LONG, reference={"answer": 9}, split=Split.EVAL)

    (leak,) = check_leakage([train], {"eval": [held]}).leaks

    assert (leak.kind, leak.similarity) == ("near_duplicate", 1.0)


# --------------------------------------------------------------------------- near-duplicates


def test_one_word_changed_in_a_long_prompt_is_a_near_duplicate_with_its_similarity() -> None:
    changed = LONG.replace("northern", "southern")
    train = [task("t0", LONG), task("t1", "Sort the list of names by surname and print the first one.")]
    held = [task("h0", changed, split=Split.EVAL)]

    report = check_leakage(train, {"eval": held})

    (leak,) = report.leaks
    assert (leak.train_id, leak.held_id, leak.kind) == ("t0", "h0", "near_duplicate")
    a, b = shingles(LONG), shingles(changed)
    assert leak.similarity == pytest.approx(len(a & b) / len(a | b))
    assert 0.8 <= leak.similarity < 1.0
    assert f"h0 = t0 (near-duplicate {leak.similarity:.2f})" in report.summary()


def test_an_unrelated_task_is_not_flagged() -> None:
    report = check_leakage(
        [task("t0", LONG)],
        {"eval": [task("h0", "List every file under /etc that mentions the word timeout.")]},
    )
    assert report.ok
    assert report.leaks == ()
    assert report.summary().startswith("no leak: none of 1 held-out tasks (eval)")


def test_normalisation_ignores_case_punctuation_and_spacing_but_keeps_numbers_apart() -> None:
    assert shingles("Hello,   World! How   are you?") == shingles("hello world how are you")
    assert shingles("it is 3.5 now") != shingles("it is 35 now")
    assert shingles("two words", n=3) == frozenset({"two words"})
    assert shingles(" ?! ") == frozenset()


def test_prompts_that_differ_only_in_their_numbers_are_not_flagged() -> None:
    a = "A tank holds 729 litres, loses 29 litres a day for 15 days, then is topped up by 76."
    b = "A tank holds 697 litres, loses 63 litres a day for 64 days, then is topped up by 37."
    assert check_leakage([task("t", a)], {"eval": [task("h", b)]}).ok


def test_same_question_over_another_initial_state_is_not_a_leak() -> None:
    # sql and files reuse question texts over different databases: a different problem, not a copy.
    train = task("t", LONG, setup={"rows": [1, 2, 3]})
    other_state = task("h1", LONG, setup={"rows": [1, 2, 4]})
    same_state = task("h2", LONG.replace("northern", "eastern"), setup={"rows": [1, 2, 3]})

    report = check_leakage([train], {"eval": [other_state, same_state]})

    assert near_pairs(report) == {("t", "h2")}


def test_threshold_is_inclusive_at_the_boundary() -> None:
    words = [f"word{i}" for i in range(12)]
    # 12 words give 10 trigrams; the first 10 words give 8 of them: Jaccard exactly 8/10.
    train = [task("t", " ".join(words))]
    held = {"eval": [task("h", " ".join(words[:10]))]}

    (leak,) = check_leakage(train, held, threshold=0.8).leaks
    assert leak.similarity == 0.8
    assert check_leakage(train, held, threshold=0.8000001).ok
    assert not check_leakage(train, held, threshold=0.79).ok


def test_a_held_out_task_matching_several_train_tasks_lists_them_most_similar_first() -> None:
    train = [task("far", LONG.replace("northern depot", "old river")), task("same", LONG)]
    held = [task("h", LONG.replace("northern", "eastern"))]

    report = check_leakage(train, {"eval": held}, threshold=0.7)

    assert [leak.train_id for leak in report.leaks] == ["same", "far"]
    assert report.leaks[0].similarity > report.leaks[1].similarity
    assert report.leaked_tasks == (("eval", "h"),)


def test_index_finds_exactly_the_pairs_a_brute_force_comparison_finds() -> None:
    # A small vocabulary makes many pairs share shingles, so the prefix filter is exercised hard.
    rng = random.Random(7)
    vocab = ["alpha", "beta", "gamma", "delta", "eps"]
    base = [" ".join(rng.choices(vocab, k=rng.randint(1, 14))) for _ in range(40)]

    def mutate(text: str) -> str:
        words = text.split()
        words[rng.randrange(len(words))] = rng.choice(vocab)
        return " ".join(words)

    train = [task(f"t{i}", rng.choice([t, mutate(t)])) for i, t in enumerate(base * 2)]
    # A reference of their own keeps held-out tasks from being exact copies: every match is scored.
    held = [task(f"h{i}", mutate(rng.choice(base)), reference=i) for i in range(40)]
    for n in (1, 2, 3):
        sets = {t.id: shingles(t.prompt[0].content, n) for t in (*train, *held)}
        for threshold in (0.3, 0.55, 0.8, 1.0):
            expected = {
                (t.id, h.id)
                for t, h in itertools.product(train, held)
                if len(sets[t.id] & sets[h.id]) / len(sets[t.id] | sets[h.id]) >= threshold
            }
            assert expected, "the case should have pairs to find"
            assert near_pairs(check_leakage(train, {"eval": held}, threshold=threshold, n=n)) == expected


# --------------------------------------------------------------------------- edges and report


def test_empty_inputs_report_no_leak() -> None:
    empty_train = check_leakage([], {"eval": [task("h", LONG)]})
    assert empty_train.ok and empty_train.train_count == 0
    assert empty_train.held_out_counts == {"eval": 1}
    no_suites = check_leakage([task("t", LONG)], {})
    assert no_suites.ok and no_suites.held_out_counts == {}
    assert "no suites" in no_suites.summary()
    assert check_leakage([task("t", LONG)], {"eval": [], "holdout": []}).ok


def test_bad_parameters_are_refused() -> None:
    for threshold in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="threshold"):
            check_leakage([], {}, threshold=threshold)
    with pytest.raises(ValueError, match="n must"):
        check_leakage([], {}, n=0)


def test_report_json_counts_everything_and_lists_a_bounded_number_of_pairs() -> None:
    train = [task(f"t{i}", f"{LONG} Item {i}.") for i in range(5)]
    eval_copies = [t.model_copy(update={"id": f"e{i}", "split": Split.EVAL}) for i, t in enumerate(train)]
    holdout = [task("x0", LONG.replace("northern", "western") + " Item 0.", split=Split.HOLDOUT)]

    report = check_leakage(train, {"eval": eval_copies, "holdout": holdout})
    record = report.to_json(max_leaks=2)

    assert json.loads(json.dumps(record)) == record
    assert record["ok"] is False
    assert record["held_out_counts"] == {"eval": 5, "holdout": 1}
    assert record["leak_count"] == len(report.leaks) >= 6
    assert record["leaked_task_count"] == 6
    assert len(record["leaks"]) == 2
    assert record["leaks"][0] == {
        "train_id": "t0",
        "held_id": "e0",
        "suite": "eval",
        "kind": "exact",
        "similarity": 1.0,
    }
    summary = report.summary()
    assert summary.startswith("leak: 6 held-out tasks (eval 5, holdout 1) match train tasks: e0 = t0 (exact)")
    assert "more pairs)" in summary and "\n" not in summary


# --------------------------------------------------------------------------- real generators and scale


@pytest.mark.parametrize(
    ("stem", "generate"),
    [("calc", calculator.generate), ("sql", sql.generate), ("files", files.generate)],
)
def test_shipped_train_examples_do_not_leak_into_freshly_generated_held_out_splits(
    stem: str, generate: Callable[[int], dict[Split, TaskSet]]
) -> None:
    data = (resources.files("reprorl") / "examples" / f"{stem}-train.jsonl").read_bytes()
    train = TaskSet.from_jsonl(f"{stem}-train", data).tasks
    splits = generate(0)
    held = {"eval": splits[Split.EVAL].tasks, "holdout": splits[Split.HOLDOUT].tasks}

    report = check_leakage(train, held)

    assert report.ok, report.summary()
    assert report.train_count == len(train) > 0
    # The check can see these sets: a held-out task copied into train is caught.
    leaked = held["eval"][3].model_copy(update={"id": f"{stem}-train-9999", "split": Split.TRAIN})
    caught = check_leakage([*train, leaked], held)
    assert [(leak.train_id, leak.held_id, leak.kind) for leak in caught.leaks] == [
        (leaked.id, held["eval"][3].id, "exact")
    ]


def test_thousands_of_tasks_find_exactly_the_planted_leaks() -> None:
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(800)]

    def text() -> str:
        numbers = [rng.randint(1, 999) for _ in range(3)]
        return (
            f"A tank holds {numbers[0]} litres, loses {numbers[1]} a day for {numbers[2]} days; "
            + " ".join(rng.choices(vocab, k=30))
            + ". Answer with a number."
        )

    train = [task(f"train-{i:05d}", text()) for i in range(5000)]
    held = [task(f"eval-{i:04d}", text(), split=Split.EVAL) for i in range(500)]
    planted_exact, planted_near = set(), set()
    for k in range(20):
        source = train[rng.randrange(len(train))]
        held[k] = source.model_copy(update={"id": held[k].id, "split": Split.EVAL})
        planted_exact.add((source.id, held[k].id))
    for k in range(20, 40):
        source = train[rng.randrange(len(train))]
        words = source.prompt[0].content.split()
        words[len(words) // 2] = "CHANGED"
        held[k] = task(held[k].id, " ".join(words), split=Split.EVAL)
        planted_near.add((source.id, held[k].id))

    report = check_leakage(train, {"eval": held})

    exact = {(leak.train_id, leak.held_id) for leak in report.leaks if leak.kind == "exact"}
    assert exact == planted_exact
    assert near_pairs(report) == planted_near
    assert all(0.8 <= leak.similarity < 1.0 for leak in report.leaks if leak.kind == "near_duplicate")
