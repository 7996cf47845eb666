"""Printing for the CLI: rich tables for people, plain JSON for programs, one-line errors."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

# Tables keep their shape when piped: a pipe gets a wide fixed width instead of 80 columns.
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


def one_line(text: str) -> str:
    """Collapse a message to a single line so an error never spills over several."""
    return " ".join(str(text).split())
