"""`reprorl runs report` on a real tiny training run, opened in headless Chromium: each chart drawn, no error.

One run serves every case: two train steps and three eval points on a six-task suite, with one invalid
action ending an episode (`max_invalid_actions = 1`) so that failed rollouts exist, and a rollback rule
so that guard checks are recorded. The browser test needs Debian's chromium and chromium-driver and
selenium; without them it is skipped, unless REPRORL_REQUIRE_BROWSER=1 (CI) makes that a failure.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from browser_support import CHART_STATE, chromium
from cli_support import Cli, tiny_training_store

from reprorl.cli.main import main
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore

SPEC = """
name = "reported"
seed = 5
[model]
owner = "t@x"
base = "tiny"
adapter = { kind = "lora", rank = 4, alpha = 8.0, targets = ["q_proj", "v_proj"] }
[data]
owner = "t@x"
train = "calc-train"
reward_weights = { outcome = 1.0, valid_calls = 1.0 }
max_invalid_actions = 1
noise = { timeout_p = 0.2, truncate_p = 0.2 }
[learning]
owner = "t@x"
steps = 2
lr = 1e-3
group_size = 3
tasks_per_step = 2
max_tokens = 16
max_turns = 2
drop_zero_variance_groups = false
[evaluation]
owner = "t@x"
suites = ["calc-eval-small"]
every_steps = 1
rollback = [{ when = "tool_failure_rate", action = "stop", threshold = 1.0 }]
[budget]
prices = { cpu_usd_per_hour = 0.5 }
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("reported")
    store = tiny_training_store(tmp)
    with resources.as_file(resources.files("reprorl") / "examples" / "calc-eval.jsonl") as path:
        lines = path.read_text().splitlines()[:6]
    (tmp / "small.jsonl").write_text("\n".join(lines) + "\n")
    store.add("calc-eval-small", tmp / "small.jsonl", kind="taskset")
    store.close()
    (tmp / "spec.toml").write_text(SPEC)
    assert main(["--home", str(tmp / "home"), "run", str(tmp / "spec.toml")]) == 0
    (run_id,) = [p.name for p in (tmp / "home" / "runs").iterdir() if not p.name.startswith(".")]
    return tmp / "home", run_id


def test_report_of_a_training_run(trained: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    home, run_id = trained
    cli = Cli(home, capsys)
    result = cli.ok_json("runs", "report", run_id)
    path = Path(result["path"])
    assert path == home / "runs" / run_id / "report.html"
    sections = {s["key"]: s for s in result["sections"]}
    assert list(sections) == [
        "header",
        "curves",
        "health",
        "pipeline",
        "tool-failures",
        "tool-usage",
        "exploration",
        "cost",
        "eval",
        "guards",
        "trajectories",
    ]
    assert [k for k, s in sections.items() if not s["has_data"]] == ["pipeline"], sections  # synchronous
    assert result["charts"] == 8 == sum(s["charts"] for s in sections.values())
    page = path.read_text(encoding="utf-8")
    assert "failed: invalid_action" in page
    assert "guard_check" in page and "calc-eval-small" in page

    # The same records give the same bytes, wherever the file goes.
    again = cli.ok_json("runs", "report", run_id, "-o", str(home.parent / "copy.html"))
    assert (home.parent / "copy.html").read_bytes() == path.read_bytes()
    assert again["bytes"] == result["bytes"] == path.stat().st_size

    # The curve's per-step means are the loop's own `reward_mean`, recomputed from the rollouts.
    store = Store(home)
    try:
        record = RunRecord(store, run_id)
        logged = {m["step"]: m["reward_mean"] for m in record.metrics().records if m.get("stage") is None}
        rows = RolloutStore(record).query("split = 'train' AND NOT retried", columns=["step", "reward_total"])
        by_step: dict[int, list[float]] = {}
        for row in rows.to_pylist():
            by_step.setdefault(row["step"], []).append(row["reward_total"] or 0.0)
    finally:
        store.close()
    assert {s: statistics.fmean(v) for s, v in by_step.items()} == pytest.approx(logged)


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def test_report_renders_in_headless_chromium(
    trained: tuple[Path, str], browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home, run_id = trained
    result = Cli(home, capsys).ok_json("runs", "report", run_id, "-o", str(tmp_path / "report.html"))
    browser.get((tmp_path / "report.html").as_uri())
    said = int(browser.execute_script("return document.body.dataset.charts"))
    assert said == result["charts"] == 8
    deadline = time.monotonic() + 30
    while True:
        charts = browser.execute_script(CHART_STATE)
        if all(c["drawn"] and c["traces"] for c in charts) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(charts) == said, charts
    for chart in charts:
        assert chart["drawn"] and chart["svgs"] > 0, chart
        assert chart["traces"] > 0 and chart["data"] > 0, chart
    # Nothing was fetched: the page's only resource is itself.
    fetched = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert fetched == []
    logs = browser.get_log("browser")
    severe = [entry for entry in logs if entry["level"] == "SEVERE"]
    assert severe == [], json.dumps(severe, indent=1)
    assert browser.save_screenshot(str(tmp_path / "report.png"))
    assert (tmp_path / "report.png").stat().st_size > 10_000
