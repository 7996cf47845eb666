"""`reprorl serve dashboard` over real runs in headless Chromium: pages, live charts, rollouts, compare.

One store serves every case: two tiny training runs that differ in one planted condition (the
learning rate), on an eval suite one of whose prompts holds a `<script>` tag, and a third run whose
rollouts are records built in code, one of each failure shape (so `termination='tool_timeout'`
matches some). Screenshots of each page go to `build/test-output/dashboard/` (REPRORL_TEST_OUTPUT
moves it), where CI keeps them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from browser_support import CHART_STATE, chromium, console_errors
from cli_support import run_ids, tiny_spec, tiny_training_store

from reprorl import DashboardServer, Store
from reprorl.cli.main import main
from reprorl.hashing import content_hash
from reprorl.store import RunRecord
from reprorl.store.rollouts import RolloutWriter
from rollout_records import batch

REPO = Path(__file__).resolve().parents[2]
XSS = "<script>window.__xss = 1</script>"
PLANTED_LR = {"dash-a": 1e-3, "dash-b": 3e-3}


def output_dir() -> Path:
    path = Path(os.environ.get("REPRORL_TEST_OUTPUT", REPO / "build" / "test-output")) / "dashboard"
    path.mkdir(parents=True, exist_ok=True)
    return path


def add_suite(tmp: Path, store: Store) -> None:
    with resources.as_file(resources.files("reprorl") / "examples" / "calc-eval.jsonl") as path:
        rows = [json.loads(line) for line in path.read_text().splitlines()[:4]]
    rows[0]["prompt"][0]["content"] = f"{XSS} {rows[0]['prompt'][0]['content']}"
    (tmp / "small.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    store.add("calc-eval-small", tmp / "small.jsonl", kind="taskset")


def spec(name: str, steps: int = 2) -> str:
    return tiny_spec(
        name,
        5,
        learning={"steps": steps, "lr": PLANTED_LR.get(name, 1e-3)},
        evaluation={"suites": ["calc-eval-small"], "every_steps": 1},
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("dashboard")
    store = tiny_training_store(tmp)
    add_suite(tmp, store)
    store.close()
    home = tmp / "home"
    ids = {}
    for name in PLANTED_LR:
        (tmp / f"{name}.toml").write_text(spec(name))
        assert main(["--home", str(home), "run", str(tmp / f"{name}.toml")]) == 0
        ids[name] = run_ids(home)[-1]
    store = Store(home)
    try:
        record = RunRecord.create(
            store,
            spec={"name": "planted"},
            spec_hash=content_hash({"name": "planted"}),
            name="planted",
            seeds={"run": 1},
        )
        writer = RolloutWriter(record)
        for step in range(2):
            writer.write(step, batch(step, 6, record.run_id))
        record.set_status("succeeded")
        ids["planted"] = record.run_id
    finally:
        store.close()
    return home, ids


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def wait_for(predicate: Any, timeout: float = 30.0, what: str = "the page") -> Any:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (NoSuchElementException, StaleElementReferenceException):
            value = None  # the next page is still loading
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def charts_drawn(browser: Any) -> list[dict[str, Any]]:
    charts = browser.execute_script(CHART_STATE)
    return charts if charts and all(c["drawn"] and c["traces"] > 0 for c in charts) else []


def shot(browser: Any, name: str) -> None:
    path = output_dir() / f"{name}.png"
    assert browser.save_screenshot(str(path))
    assert path.stat().st_size > 10_000, path


def test_dashboard_in_headless_chromium(runs: tuple[Path, dict[str, str]], browser: Any) -> None:
    home, ids = runs
    from selenium.webdriver.common.by import By

    store = Store(home)
    with DashboardServer(store) as server:
        # The run list: every run, each a link to its page.
        browser.get(server.url + "/")
        listed = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#run-table a")]
        assert sorted(listed) == sorted(ids.values())
        assert console_errors(browser) == []
        shot(browser, "1-runs")

        # A run page: the report's sections drawn as live charts, no console error.
        browser.find_element(By.LINK_TEXT, ids["dash-a"]).click()
        charts = wait_for(lambda: charts_drawn(browser), what="the run's charts")
        assert len(charts) >= 5, charts
        assert browser.find_element(By.ID, "run-steps").text == "2"
        assert "ended" in wait_for(
            lambda: (
                browser.find_element(By.ID, "live-note").text.count("ended")
                and browser.find_element(By.ID, "live-note").text
            )
        )
        for key in ("curves", "health", "cost", "tool-failures", "eval", "guards"):
            assert browser.find_elements(By.ID, f"sec-{key}"), key
        assert console_errors(browser) == []
        shot(browser, "2-run")

        # The rollout viewer: the CLI's SQL filter, then one rollout as a conversation.
        browser.get(f"{server.url}/runs/{ids['planted']}/rollouts")
        where = browser.find_element(By.NAME, "where")
        where.send_keys("termination='tool_timeout'")
        where.submit()
        wait_for(
            lambda: "tool_timeout" in browser.find_element(By.ID, "rollout-count").text,
            what="the filtered table",
        )
        cells = browser.find_elements(By.CSS_SELECTOR, "#rollout-table tbody td:nth-child(5)")
        assert cells and {c.text for c in cells} == {"tool_timeout"}
        assert browser.find_element(By.ID, "rollout-count").text.startswith(f"{len(cells)} rollouts match")
        shot(browser, "3-rollouts-filtered")
        browser.find_elements(By.CSS_SELECTOR, "a.rollout-link")[0].click()
        turns = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "li.turn"), what="the turns")
        assert len(turns) == 2
        outcomes = [
            e.get_attribute("data-outcome") for e in browser.find_elements(By.CSS_SELECTOR, ".tool-result")
        ]
        assert outcomes == ["ok", "tool_timeout"]
        assert len(browser.find_elements(By.CSS_SELECTOR, ".heat .tok")) == 48  # 24 sampled tokens a turn
        assert console_errors(browser) == []
        shot(browser, "4-rollout")

        # A real rollout whose task prompt holds a script: shown as text, never run; replayed identically.
        browser.get(
            f"{server.url}/runs/{ids['dash-a']}/rollouts?split=eval&task=calculator-eval-0000&per_page=1"
        )
        browser.find_elements(By.CSS_SELECTOR, "a.rollout-link")[0].click()
        prompt = wait_for(
            lambda: browser.find_elements(By.CSS_SELECTOR, "#sec-prompt pre"), what="the prompt"
        )
        assert prompt[0].text.startswith(XSS)
        assert browser.execute_script("return document.querySelectorAll('main script, main img').length") == 0
        assert browser.find_elements(By.CSS_SELECTOR, ".heat .tok")
        browser.find_element(By.ID, "replay").click()
        result = wait_for(
            lambda: (
                browser.find_element(By.ID, "replay-result").get_attribute("data-done")
                and browser.find_element(By.ID, "replay-result")
            ),
            120,
            "the replay",
        )
        assert result.text.startswith("Identical:"), result.text
        assert console_errors(browser) == []
        shot(browser, "5-rollout-replayed")

        # Compare: the planted condition named first, then the curves overlaid and the paired eval.
        browser.get(f"{server.url}/")
        for run in (ids["dash-a"], ids["dash-b"]):
            browser.find_element(By.CSS_SELECTOR, f'input[value="{run}"]').click()
        browser.find_element(By.CSS_SELECTOR, "#run-table button").click()
        fields = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "code.field"), what="the diff")
        differing = [f.text for f in fields]
        assert "learning.lr" in differing, differing
        assert "0.001" in browser.page_source and "0.003" in browser.page_source
        charts = wait_for(lambda: charts_drawn(browser), what="the overlaid curves")
        assert len(charts) == 3 and all(c["data"] >= 2 for c in charts), charts
        assert console_errors(browser) == []
        shot(browser, "6-compare")

        # Artifacts and lineage.
        browser.get(f"{server.url}/artifacts")
        assert browser.find_element(By.LINK_TEXT, "calc-eval-small")
        browser.get(f"{server.url}/lineage?run={ids['dash-a']}")
        boxes = browser.find_elements(By.CSS_SELECTOR, "svg.lineage rect")
        assert len(boxes) >= 4  # base, train set, eval suite -> run -> adapter
        assert console_errors(browser) == []
        shot(browser, "7-lineage")
    store.close()


def test_run_page_follows_a_running_run(
    runs: tuple[Path, dict[str, str]], browser: Any, tmp_path: Path
) -> None:
    home, _ = runs
    from selenium.webdriver.common.by import By

    (tmp_path / "live.toml").write_text(spec("dash-live", steps=6))
    before = set(run_ids(home))
    store = Store(home)
    with DashboardServer(store, poll_s=0.2, decode_tokens=False) as server:
        child = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "reprorl"),
                "--home",
                str(home),
                "run",
                str(tmp_path / "live.toml"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            run = wait_for(lambda: set(run_ids(home)) - before, 60, "the run folder").pop()
            browser.get(f"{server.url}/runs/{run}")
            browser.execute_script("window.__sameDocument = true")
            seen = []
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                steps = int(browser.find_element(By.ID, "run-steps").text)
                if not seen or steps != seen[-1]:
                    seen.append(steps)
                if browser.find_element(By.ID, "run-status").text == "succeeded":
                    break
                time.sleep(0.1)
            assert child.wait(120) == 0, child.stderr.read() if child.stderr else ""
        finally:
            child.kill()
            child.wait()
        assert browser.execute_script("return window.__sameDocument === true"), "the page was reloaded"
        assert seen == sorted(seen) and len(seen) >= 3 and seen[-1] == 6, seen
        revision = int(browser.find_element(By.ID, "sections").get_attribute("data-revision"))
        assert revision >= 2  # the sections were redrawn as the run went
        assert charts_drawn(browser)
        assert console_errors(browser) == []
        shot(browser, "8-run-live")
    store.close()
