"""Mixed-family draws: each step's tasks shared by `data.family_weights`, seeded, and figures per family."""

from __future__ import annotations

from collections import Counter

import pytest

from reprorl.config import RunSpec
from reprorl.orchestrate.run.rollouts import family_metrics, family_quotas, step_tasks
from reprorl.types import Message, Task
from rollout_records import make


def _tasks(counts: dict[str, int]) -> list[Task]:
    prompt = (Message(role="user", content="q"),)
    return [Task(id=f"{f}-{i}", family=f, prompt=prompt) for f, n in counts.items() for i in range(n)]


def _spec(weights: dict[str, float] | None, per_step: int = 6, seed: int = 0) -> RunSpec:
    owner = "t@example.com"
    return RunSpec.model_validate(
        {
            "name": "mix",
            "seed": seed,
            "model": {"owner": owner, "base": "m@sha256:" + "0" * 64},
            "data": {"owner": owner, "train": "t@sha256:" + "0" * 64, "family_weights": weights},
            "learning": {"owner": owner, "tasks_per_step": per_step},
            "evaluation": {"owner": owner, "suites": ["e@sha256:" + "1" * 64]},
        }
    )


@pytest.mark.parametrize(
    ("weights", "sizes", "count", "expected"),
    [
        ({"a": 1, "b": 1, "c": 1}, {"a": 9, "b": 9, "c": 9}, 6, {"a": 2, "b": 2, "c": 2}),
        ({"a": 1, "b": 2}, {"a": 9, "b": 9}, 6, {"a": 2, "b": 4}),
        ({"a": 1, "b": 1, "c": 1}, {"a": 9, "b": 9, "c": 9}, 4, {"a": 2, "b": 1, "c": 1}),  # ties by name
        ({"a": 1, "b": 1}, {"a": 1, "b": 9}, 6, {"a": 1, "b": 5}),  # a full family's share goes on
        ({"a": 0, "b": 1}, {"a": 9, "b": 9}, 3, {"b": 3}),
        ({"a": 1, "b": 1}, {"a": 2, "b": 1}, 10, {"a": 2, "b": 1}),  # fewer tasks than asked
    ],
)
def test_quotas_follow_the_weights_and_the_sizes(
    weights: dict[str, float], sizes: dict[str, int], count: int, expected: dict[str, int]
) -> None:
    assert family_quotas(weights, sizes, count) == expected


def test_every_step_draws_each_family_its_share_the_same_on_every_rerun() -> None:
    tasks = _tasks({"calculator": 20, "sql": 20, "files": 20})
    spec = _spec({"calculator": 1, "sql": 1, "files": 1})
    draws = [step_tasks(tasks, spec, step) for step in range(20)]
    assert all(Counter(t.family for t in d) == {"calculator": 2, "sql": 2, "files": 2} for d in draws)
    assert draws == [step_tasks(tasks, spec, step) for step in range(20)]
    assert all(len({t.id for t in d}) == 6 for d in draws)  # without replacement
    assert len({tuple(t.id for t in d) for d in draws}) > 15  # steps draw differently
    other_seed = _spec({"calculator": 1, "sql": 1, "files": 1}, seed=1)
    assert draws != [step_tasks(tasks, other_seed, step) for step in range(20)]


def test_without_weights_one_draw_mixes_the_families_by_chance() -> None:
    tasks = _tasks({"calculator": 20, "sql": 20, "files": 20})
    draws = [step_tasks(tasks, _spec(None), step) for step in range(30)]
    shares = [Counter(t.family for t in d) for d in draws]
    assert any(len(s) < 3 or max(s.values()) > 2 for s in shares)


@pytest.mark.parametrize(
    ("weights", "says"),
    [
        ({"a": -1.0}, "finite and >= 0"),
        ({"a": 0.0}, "no family a weight above 0"),
        ({"a": float("nan")}, "finite"),
    ],
)
def test_weights_that_share_nothing_are_refused(weights: dict[str, float], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        _spec(weights)


def test_figures_per_family_count_only_scored_rollouts() -> None:
    tasks = _tasks({"calculator": 2, "sql": 2})
    kinds = [
        ("calculator-0", "answered"),
        ("calculator-1", "tool_timeout"),
        ("sql-0", "answered"),
        ("sql-1", "infra_error"),
    ]
    rollouts = [make(i, kind).model_copy(update={"task_id": task}) for i, (task, kind) in enumerate(kinds)]
    metrics = family_metrics(rollouts, tasks)
    assert metrics["family/calculator/success"] == 0.5 and metrics["family/calculator/rollouts"] == 2
    # The infrastructure's failure is left out, never counted as a failed sql task.
    assert metrics["family/sql/success"] == 1.0 and metrics["family/sql/rollouts"] == 1
