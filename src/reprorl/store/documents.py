"""Record documents read defensively: a JSON object or the reason it could not be read, and Arrow rows
made plain — for tools that report on whatever survived of a run rather than stop at the first gap."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def json_doc(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A JSON object document, or None and why it could not be read."""
    try:
        value = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None, f"{path.name} is missing"
    except (OSError, ValueError) as exc:
        return None, f"{path.name} is not readable JSON: {exc}"
    if not isinstance(value, dict):
        return None, f"{path.name} does not hold a JSON object"
    return value, None


def plain_row(row: dict[str, Any]) -> dict[str, Any]:
    """A rollout-table row with its map columns as dicts (Arrow returns them as lists of pairs)."""
    for key in ("tool_versions", "reward_components"):
        if isinstance(row.get(key), list):
            row[key] = dict(row[key])
    return row
