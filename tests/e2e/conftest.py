"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import Cli


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(tmp_path / "home", capsys)
