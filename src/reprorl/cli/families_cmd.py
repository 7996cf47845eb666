"""`reprorl tasks families`: every registered env family, its env and tools, and where it came from."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from reprorl.cli.output import console, print_json
from reprorl.rollout.families import FAMILIES


def families(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List every env family: built in, or offered by an installed package (entry point reprorl.families)."""
    rows: list[dict[str, Any]] = []
    for name, found in sorted(FAMILIES.load_all().items()):
        origin = FAMILIES.origin(name)
        rows.append(
            {
                "name": name,
                "env": f"{found.env.__module__}:{found.env.__qualname__}",
                "tools": [tool.name for tool in found.env.tools],
                "tool_modules": list(found.tool_modules),
                "cross_verifiers": [type(v).__name__ for v in found.cross],
                "origin": {
                    "module": origin.module,
                    "distribution": origin.distribution,
                    "entry_point": origin.entry_point,
                },
            }
        )
    if as_json:
        print_json(rows)
        return
    table = Table("family", "env", "tools", "tool modules", "from")
    for row in rows:
        origin = row["origin"]
        where = (
            f"{origin['distribution']} ({origin['entry_point']})"
            if origin["distribution"]
            else f"built in ({origin['module']})"
            if origin["module"].startswith("reprorl.")
            else origin["module"]
        )
        table.add_row(row["name"], row["env"], ", ".join(row["tools"]), ", ".join(row["tool_modules"]), where)
    console.print(table)
