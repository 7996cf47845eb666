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
