"""Headless Chromium for the browser tests: Debian's chromium and chromium-driver through selenium.

Without them a browser test is skipped, unless REPRORL_REQUIRE_BROWSER=1 (CI) makes that a failure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1800",
)
CHART_STATE = """
return Array.from(document.querySelectorAll('.plotly-graph-div, .js-plotly-plot')).map(div => ({
  id: div.id,
  drawn: div.classList.contains('js-plotly-plot'),
  svgs: div.querySelectorAll('svg.main-svg').length,
  traces: div.querySelectorAll('g.trace').length,
  data: (div.data || []).length,
}));
"""


def browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not binary.is_file():
            return f"{binary} is missing (apt-get install chromium chromium-driver)"
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium driver that keeps the page's console log, or a skip (a failure in CI)."""
    missing = browser_missing()
    if missing:
        if os.environ.get("REPRORL_REQUIRE_BROWSER") == "1":
            pytest.fail(f"REPRORL_REQUIRE_BROWSER=1 but {missing}")
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = Path(tempfile.mkdtemp(prefix="reprorl-chromium-"))
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def console_errors(driver: Any) -> list[dict[str, Any]]:
    """The page's console entries at error level since the last call."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
