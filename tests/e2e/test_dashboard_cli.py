"""`reprorl serve dashboard` as a person starts it: prints the URL once, answers, stops on SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from cli_support import Cli

REPRORL = str(Path(sys.executable).parent / "reprorl")


def start(home: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    child = subprocess.Popen(
        [REPRORL, "--home", str(home), "serve", "dashboard", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    found = re.search(r"on (http://\S+)", line)
    if not found:
        child.kill()
        pytest.fail(f"no URL in {line!r}: {child.stderr.read() if child.stderr else ''}")
    return child, found.group(1)


def stop(child: subprocess.Popen[str]) -> None:
    child.send_signal(signal.SIGTERM)
    assert child.wait(30) == 0


def test_serves_the_store_on_loopback_and_stops_on_sigterm(tmp_path: Path) -> None:
    child, url = start(tmp_path / "home")
    try:
        assert url.startswith("http://127.0.0.1:") and "token" not in url
        page = httpx.get(url, timeout=10)
        assert page.status_code == 200 and "No runs in this store yet." in page.text
    finally:
        stop(child)
    assert not (tmp_path / "home").exists()  # reading an empty store wrote nothing


def test_off_loopback_the_printed_url_carries_the_token(tmp_path: Path) -> None:
    child, url = start(tmp_path / "home", "--host", "0.0.0.0")
    try:
        token = url.split("token=", 1)[1]
        local = url.split("/?", 1)[0].replace("0.0.0.0", "127.0.0.1")
        assert httpx.get(local + "/api/runs", timeout=10).status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.get(local + "/api/runs", headers=auth, timeout=10).json() == []
    finally:
        stop(child)


def test_bad_flags_are_one_line(cli: Cli) -> None:
    assert "--port" in cli.error("serve", "dashboard", "--port", "70000")
    assert cli.error("serve", "dashboard", "--host", "no-such-host.invalid").startswith("error: host: ")
