"""Rendering a run's report: its records read once, every section built, one HTML file written atomically."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprorl.errors import ReprorlError
from reprorl.report import exploration, pipeline, sections, tables, trajectories
from reprorl.report.page import Section, document, none_line
from reprorl.report.records import RunView
from reprorl.store import RunRecord, Store, find_run
from reprorl.store.atomic import write_atomic
from reprorl.version import __version__

REPORT_FILE = "report.html"
BUILDERS: tuple[tuple[str, str, Callable[[RunView], Section]], ...] = (
    ("header", "Run", sections.header),
    ("curves", "Reward and success", sections.curves),
    ("health", "Training health", sections.health),
    ("pipeline", "Sampling ahead", pipeline.pipeline),
    ("tool-failures", "Tool failures", sections.tool_failures),
    ("tool-usage", "Tool usage", sections.tool_usage),
    ("exploration", "Exploration", exploration.exploration),
    ("cost", "Cost", sections.cost),
    ("eval", "Eval points", tables.evals),
    ("guards", "Guard events", tables.guards),
    ("trajectories", "Sample trajectories", trajectories.samples),
)


@dataclass(frozen=True)
class Report:
    """A rendered report: the page and the sections it holds."""

    run_id: str
    html: str
    sections: tuple[Section, ...]

    @property
    def charts(self) -> int:
        return sum(len(s.charts) for s in self.sections)


@dataclass(frozen=True)
class ReportResult:
    """Where a report was written and what it holds."""

    path: Path
    run_id: str
    sections: tuple[dict[str, Any], ...]
    charts: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "run_id": self.run_id,
            "sections": list(self.sections),
            "charts": self.charts,
            "bytes": self.bytes,
        }


def build_report(store: Store, run: str | RunRecord) -> Report:
    """The report page of a run (an id, a unique id prefix, or its record); reads records only."""
    record = run if isinstance(run, RunRecord) else find_run(store, run)
    view = RunView.load(store, record)
    built = []
    for key, title, build in BUILDERS:
        try:
            built.append(build(view))
        except (ReprorlError, OSError, ValueError, KeyError, TypeError) as exc:
            # A record of an unexpected shape costs its own section, not the report.
            text = f"This section could not be built from the records: {type(exc).__name__}: {exc}"
            built.append(Section(key, title, (none_line(text),), has_data=False))
    name = (view.info or {}).get("name")
    title = f"reprorl report — {name} ({record.run_id})" if name else f"reprorl report — {record.run_id}"
    subtitle = f"Run {record.run_id}: every figure below is read from the run's records."
    footer = f"Rendered by reprorl {__version__} from {record.run_id}'s records; nothing in it is fetched."
    page = document(record.run_id, title, subtitle, built, footer)
    return Report(record.run_id, page, tuple(built))


def render_report(store: Store, run: str | RunRecord, output: Path | str | None = None) -> ReportResult:
    """Write a run's report as one self-contained HTML file (default: `report.html` in the run folder)."""
    record = run if isinstance(run, RunRecord) else find_run(store, run)
    report = build_report(store, record)
    path = Path(output) if output is not None else record.path / REPORT_FILE
    data = report.html.encode("utf-8")
    write_atomic(path, data)
    return ReportResult(
        path=path,
        run_id=report.run_id,
        sections=tuple(s.summary() for s in report.sections),
        charts=report.charts,
        bytes=len(data),
    )
