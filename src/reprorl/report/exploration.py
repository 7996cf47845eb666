"""The report's exploration section: success per env family, calls of each tool the oracle needs, and
the alarms raised when one went unused."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reprorl.report.charts import panels_chart
from reprorl.report.page import Section, esc, no_data, note, table
from reprorl.report.records import RunView
from reprorl.report.series import metric_band

FAMILY = "family/"
EXPLORATION = "exploration/"
ALARM_EVENT = "tool_unexplored"  # as the loop's exploration watch writes it
ORACLE_EVENT = "oracle_tools"


def _keys(lines: Sequence[Mapping[str, Any]], prefix: str, suffix: str = "") -> list[str]:
    return sorted({k for m in lines for k in m if k.startswith(prefix) and k.endswith(suffix)})


def exploration(view: RunView) -> Section:
    lines = view.train_lines()
    success = _keys(lines, FAMILY, "/success")
    calls = _keys(lines, EXPLORATION)
    if not success and not calls:
        return no_data(
            "exploration",
            "Exploration",
            "No per-family or per-tool figures were recorded (a run from before they were logged).",
        )
    parts: list[Any] = []
    if success:
        bands = [metric_band(lines, k, k.removeprefix(FAMILY).removesuffix("/success")) for k in success]
        parts.append(
            panels_chart(
                "chart-family-success", "train success per step, by env family", [("success", bands)]
            )
        )
    by_family: dict[str, list[str]] = {}
    for key in calls:
        by_family.setdefault(key.split("/")[1], []).append(key)
    if by_family:
        panels = [
            (family, [metric_band(lines, k, k.rsplit("/", 1)[1]) for k in keys])
            for family, keys in sorted(by_family.items())
        ]
        parts.append(
            panels_chart("chart-needed-tools", "calls that ran of each tool the oracle needs", panels)
        )
    oracle = view.events_named(ORACLE_EVENT)
    if oracle:
        needed = oracle[-1].get("needed") or {}
        listed = "; ".join(f"{f}: {', '.join(map(str, t))}" for f, t in sorted(needed.items())) or "none"
        parts.append(
            note(
                f"Needed tools (those that ran in a successful oracle demonstration of the train tasks): "
                f"{listed}. A step that drew no task of a family leaves a gap in its panel."
            )
        )
    alarms = view.events_named(ALARM_EVENT)
    if alarms:
        rows = [
            [
                esc(e.get("step", "")),
                esc(e.get("family", "")),
                f'<span class="bad">{esc(e.get("tool", ""))}</span>',
                esc(", ".join(map(str, e.get("steps") or []))),
            ]
            for e in alarms
        ]
        parts.append(table(["alarm at step", "family", "tool never run", "in steps"], rows))
    else:
        parts.append(note("No tool_unexplored alarm: every needed tool ran within the alarm's window."))
    return Section("exploration", "Exploration", tuple(parts))
