"""In-loop screening on a tiny run (and a `reprorl sample` of the same spec): every step draws by the
verdicts its record holds, resting tasks wait while others are ready, and the tasks that last showed
signal become `<train>-signal` with their lineage (the eval suite untouched)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
from cli_support import Cli, run_ids, tiny_home, tiny_spec

from reprorl.config.load import stored_spec
from reprorl.orchestrate.run.rollouts import step_tasks
from reprorl.orchestrate.run.signal_pool import EVENT, REGISTERED_EVENT, SIGNAL, SignalPool
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore

pytestmark = pytest.mark.slow


def _drawn(record: RunRecord, step: int) -> set[str]:
    rows = RolloutStore(record).query(f"step = {step} AND split = 'train'", columns=["task_id"])
    return set(rows.column("task_id").to_pylist())


@pytest.mark.parametrize("job", ["run", "sample"])
def test_each_step_draws_around_the_resting_tasks_and_the_signal_tasks_are_registered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], job: str
) -> None:
    home = tiny_home(tmp_path, "home")
    store = Store(home)
    with resources.as_file(resources.files("reprorl") / "examples" / "calc-train.jsonl") as path:
        (tmp_path / "six.jsonl").write_text("".join(path.read_text().splitlines(keepends=True)[:6]))
    store.add("calc-six", tmp_path / "six.jsonl", kind="taskset")
    spec_path = tmp_path / "screen.toml"
    spec_path.write_text(
        tiny_spec(
            "screen",
            data={"train": "calc-six", "screen": {"rest_steps": 3}},
            learning={"steps": 3, "tasks_per_step": 2, "max_turns": 1},
        )
    )
    args = (
        ("run", str(spec_path))
        if job == "run"
        else ("sample", str(spec_path), "--steps", "3", "--no-progress")
    )
    code, _, err = Cli(home, capsys)(*args)
    assert code == 0, err
    (run_id,) = run_ids(home)
    record = RunRecord(store, run_id)
    spec = stored_spec(record.spec())
    tasks = store.taskset(str(spec.data.train)).tasks
    events = record.events().records
    verdicts = [e for e in events if e["event"] == EVENT]
    assert [e["step"] for e in verdicts] == list(range(3))

    pool, rested = SignalPool(rest_steps=3, lag=0), 0
    for step in range(3):
        resting = pool.resting(step)
        expected = {t.id for t in step_tasks(tasks, spec, step, resting)}
        assert _drawn(record, step) == expected, step
        ready = [t.id for t in tasks if t.id not in resting]
        if len(ready) >= 2:
            assert not expected & resting.keys(), step  # a resting task waits while two are ready
        rested += expected != {t.id for t in step_tasks(tasks, spec, step)}
        pool.observe(step, verdicts[step]["verdicts"])
    assert rested, "no step drew otherwise than the unscreened draw: screening never acted"
    lines = [m for m in record.metrics().records if m.get("stage") is None]
    assert all("screen/resting" in m and "screen/signal" in m for m in lines)

    (registered,) = [e for e in events if e["event"] == REGISTERED_EVENT]
    latest = pool.latest(3)
    signal = sorted(t for t, (_, v) in latest.items() if v == SIGNAL)
    assert signal, "this seed's last verdicts include a signal task"
    subset = store.taskset(registered["artifact"])
    assert [t.id for t in subset.tasks] == signal and registered["artifact"].startswith("calc-six-signal@")
    parents = {(p, role) for p, role, _ in store.registry.parents(store.resolve(registered["artifact"]).hash)}
    assert (store.resolve(str(spec.data.train)).hash, "screened_from") in parents
    assert {t.id for t in store.taskset(store.pin_newest("calc-eval")).tasks}.isdisjoint(signal)
