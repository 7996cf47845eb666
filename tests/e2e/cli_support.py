"""The CLI run in-process with its output captured, for end-to-end tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reprorl.cli.main import main


class Cli:
    def __init__(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.home = home
        self.capsys = capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        code = main(["--home", str(self.home), *args])
        out, err = self.capsys.readouterr()
        return code, out, err

    def ok_json(self, *args: str) -> Any:
        code, out, err = self(*args, "--json")
        assert code == 0, err
        return json.loads(out)

    def error(self, *args: str) -> str:
        code, out, err = self(*args)
        assert code == 2, (out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        return lines[0]
