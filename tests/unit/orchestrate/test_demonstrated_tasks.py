"""Which train tasks the SFT warm start demonstrates (`learning.sft_demonstrations`)."""

from __future__ import annotations

import pytest

from reprorl.orchestrate.run.warm_start import demonstrated_tasks
from reprorl.types import Message, Task

TASKS = [Task(id=f"t{i}", family="f", prompt=(Message(role="user", content=str(i)),)) for i in range(20)]


def test_all_tasks_without_a_count_and_a_seeded_draw_in_order_with_one() -> None:
    assert demonstrated_tasks(TASKS, None, 0) == TASKS
    drawn = demonstrated_tasks(TASKS, 5, 0)
    assert len(drawn) == 5 and drawn == [t for t in TASKS if t in drawn]  # the train set's order
    assert demonstrated_tasks(TASKS, 5, 0) == drawn  # the same on every rerun
    others = {tuple(t.id for t in demonstrated_tasks(TASKS, 5, seed)) for seed in range(1, 6)}
    assert len(others | {tuple(t.id for t in drawn)}) > 1  # the run's seed picks them
    assert demonstrated_tasks(TASKS, 20, 3) == TASKS
    with pytest.raises(ValueError, match="21 demonstrations"):
        demonstrated_tasks(TASKS, 21, 0)


def test_a_set_of_several_families_gives_each_its_share() -> None:
    mixed = [
        Task(id=f"{family}{i}", family=family, prompt=(Message(role="user", content=str(i)),))
        for family, size in (("a", 30), ("b", 30), ("c", 15))
        for i in range(size)
    ]
    drawn = demonstrated_tasks(mixed, 20, 0)
    shares = {f: sum(t.family == f for t in drawn) for f in "abc"}
    assert shares == {"a": 8, "b": 8, "c": 4}  # 20 x 30/75, 20 x 30/75, 20 x 15/75
    assert drawn == [t for t in mixed if t in drawn] and demonstrated_tasks(mixed, 20, 0) == drawn
    assert {t.id for t in demonstrated_tasks(mixed, 20, 1)} != {t.id for t in drawn}
    odd = demonstrated_tasks(mixed, 7, 0)  # 2.8, 2.8, 1.4: the two largest remainders round up
    assert len(odd) == 7 and {f: sum(t.family == f for t in odd) for f in "abc"} == {"a": 3, "b": 3, "c": 1}
