"""Runs: the run list (filter, search) and one run's live page, its sections and its update stream.

A run page draws the report's own sections (`reprorl.report`): the server builds them from the
records and sends their HTML with the charts as figures; the page's script redraws them whenever the
update stream says the run's logs grew, so a running run's curves move without a reload.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import plotly.io as pio
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, StreamingResponse

from reprorl.dashboard.layout import form, link, number, page, section, select, text_input
from reprorl.dashboard.reader import RunCache, StoreReader
from reprorl.errors import ReprorlError
from reprorl.report.charts import Chart
from reprorl.report.page import Section, esc, facts, none_line, table
from reprorl.report.records import RunView
from reprorl.report.render import BUILDERS
from reprorl.report.tables import GUARD_EVENTS
from reprorl.store.runs import FINAL_STATUSES, LogReadResult
from reprorl.threads import off_loop

router = APIRouter()
STATUSES = ("created", "running", *sorted(FINAL_STATUSES))
MAX_LISTED = 500
STREAM_S = 60.0


def reader_of(request: Request) -> StoreReader:
    reader: StoreReader = request.app.state.reader
    return reader


# -- the run list ------------------------------------------------------------------------------


def run_row(reader: StoreReader, cache: RunCache) -> dict[str, Any]:
    """One run as the list shows it: what it is, where it stands, and its latest eval figure."""
    info, spec, status = cache.info(), cache.spec(), cache.status()
    train, evals = cache.train_lines(), cache.eval_lines()
    base = (spec.get("model") or {}).get("base")
    headline = headline_eval(evals[-1]) if evals else None
    return {
        "run_id": cache.record.run_id,
        "name": info.get("name") or spec.get("name"),
        "status": status.get("status", "unknown"),
        "base": reader.label(str(base)) if base else None,
        "created_at": info.get("created_at"),
        "steps": len(train),
        "steps_planned": (spec.get("learning") or {}).get("steps"),
        "eval": headline,
    }


def headline_eval(line: dict[str, Any]) -> dict[str, Any] | None:
    """The first suite's success at an eval point, with its interval."""
    suites = sorted(k.split("/")[1] for k in line if k.startswith("eval/") and k.endswith("/success"))
    if not suites:
        return None
    suite = suites[0]

    def get(name: str) -> Any:
        return line.get(f"eval/{suite}/{name}")

    return {
        "suite": suite,
        "step": line.get("step"),
        "success": get("success"),
        "low": get("success_low"),
        "high": get("success_high"),
    }


def _headline_html(e: dict[str, Any] | None) -> str:
    if not e:
        return '<span class="none">no eval point</span>'
    interval = f"[{number(e['low'], 2)}, {number(e['high'], 2)}]"
    return f"{esc(e['suite'])}: {number(e['success'])} {interval} at step {esc(e['step'])}"


def _matches(row: dict[str, Any], query: str, status: str) -> bool:
    if status and row["status"] != status:
        return False
    if not query:
        return True
    haystack = " ".join(str(row.get(k) or "") for k in ("run_id", "name", "base")).lower()
    return all(word in haystack for word in query.lower().split())


def listed_runs(reader: StoreReader, query: str = "", status: str = "") -> list[dict[str, Any]]:
    rows = []
    for run_id in reader.run_ids():
        try:
            row = run_row(reader, reader.run(run_id))
        except Exception:
            row = {
                "run_id": run_id,
                "name": None,
                "status": "unreadable",
                "base": None,
                "created_at": None,
                "steps": 0,
                "steps_planned": None,
                "eval": None,
            }
        if _matches(row, query, status):
            rows.append(row)
        if len(rows) >= MAX_LISTED:
            break
    return rows


@router.get("/api/runs")
def api_runs(request: Request, q: str = "", status: str = "") -> list[dict[str, Any]]:
    return listed_runs(reader_of(request), q, status)


@router.get("/", response_class=HTMLResponse)
def run_list(request: Request, q: str = "", status: str = "") -> HTMLResponse:
    rows = listed_runs(reader_of(request), q, status)
    filters = form(
        "/",
        [
            text_input("q", "search", q, placeholder="id, name or model"),
            select("status", "status", STATUSES, status),
        ],
    )
    body = [filters]
    if rows:
        compare = '<p class="note">Tick two or more runs and press Compare.</p>'
        cells = []
        for r in rows:
            e = r["eval"]
            ev = _headline_html(e)
            planned = f" / {esc(r['steps_planned'])}" if r["steps_planned"] is not None else ""
            cells.append(
                [
                    f'<input type="checkbox" name="runs" value="{esc(r["run_id"])}">',
                    link(f"/runs/{r['run_id']}", r["run_id"]),
                    esc(r["name"] or ""),
                    f'<span class="status status-{esc(r["status"])}">{esc(r["status"])}</span>',
                    esc(r["base"] or ""),
                    esc((r["created_at"] or "")[:19]),
                    f"{esc(r['steps'])}{planned}",
                    ev,
                ]
            )
        grid = table(
            ["", "run", "name", "status", "base model", "started", "steps", "headline eval [95% CI]"], cells
        )
        body.append(
            f'<form method="get" action="/compare" id="run-table">{compare}{grid}'
            '<button type="submit">Compare</button></form>'
        )
    else:
        body.append(none_line("No runs match." if q or status else "No runs in this store yet."))
    return page("Runs", section("runs", f"Runs ({len(rows)})", "\n".join(body)), active="runs")


# -- one run -----------------------------------------------------------------------------------


def snapshot(cache: RunCache) -> dict[str, Any]:
    """Where a run stands, small enough to send on every change."""
    train = cache.train_lines()
    status = cache.status()
    return {
        "run_id": cache.record.run_id,
        "status": status.get("status", "unknown"),
        "steps": len(train),
        "last_step": train[-1]["step"] if train else None,
        "evals": len(cache.eval_lines()),
        "metric_lines": cache.metrics.lines,
        "event_lines": cache.events.lines,
    }


@router.get("/api/runs/{run_id}")
def api_run(request: Request, run_id: str) -> dict[str, Any]:
    cache = reader_of(request).run(run_id)
    return {**snapshot(cache), **run_row(reader_of(request), cache)}


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: str) -> HTMLResponse:
    reader = reader_of(request)
    cache = reader.run(run_id)
    row, now = run_row(reader, cache), snapshot(cache)
    guards = [e for e in cache.events.records if e.get("event") in GUARD_EVENTS]
    outcomes = sorted({str(e.get("outcome") or e.get("event")) for e in guards})
    planned = f" / {esc(row['steps_planned'])}" if row["steps_planned"] is not None else ""
    head = facts(
        [
            (
                "status",
                f'<span id="run-status" class="status status-{esc(now["status"])}">'
                f"{esc(now['status'])}</span>",
            ),
            ("steps", f'<span id="run-steps">{esc(now["steps"])}</span>{planned}'),
            ("eval points", f'<span id="run-evals">{esc(now["evals"])}</span>'),
            ("name", esc(row["name"] or "")),
            ("base model", esc(row["base"] or "")),
            ("started", esc(row["created_at"] or "")),
            ("guards", esc(f"{len(guards)} events: {', '.join(outcomes)}" if guards else "no guard events")),
            (
                "records",
                " · ".join(
                    [
                        link(f"/runs/{run_id}/rollouts", "rollouts"),
                        link(f"/compare?runs={run_id}", "compare with…"),
                        link(f"/lineage?run={run_id}", "lineage"),
                    ]
                ),
            ),
        ]
    )
    live = '<p class="note" id="live-note">Live: this page redraws as the run writes its records.</p>'
    body = (
        section("run", "Run", head + live)
        + '\n<div id="sections"><p class="note">Loading sections…</p></div>'
    )
    return page(
        f"Run {row['name'] or run_id}", body, active="runs", charts=True, data={"run": run_id, "page": "run"}
    )


def _section_json(built: Section) -> tuple[dict[str, Any], dict[str, Any]]:
    """A report section as the page draws it: HTML with empty chart divs, and each chart's figure."""
    parts, figures = [], {}
    for part in built.parts:
        if isinstance(part, Chart):
            parts.append(f'<div class="chart"><div class="plot" id="{esc(part.div_id)}"></div></div>')
            figures[part.div_id] = json.loads(pio.to_json(part.figure, validate=False))
        else:
            parts.append(part)
    html = (
        f'<section id="sec-{esc(built.key)}">\n<h2>{esc(built.title)}</h2>\n'
        + "\n".join(parts)
        + "\n</section>"
    )
    return {"key": built.key, "title": built.title, "html": html, "charts": list(figures)}, figures


def built_sections(reader: StoreReader, cache: RunCache) -> dict[str, Any]:
    """Every report section but the header (the page's head says it, live), with its figures."""
    # The run's own rollout store and logs as the dashboard holds them: part files already verified
    # stay verified, and the logs are not read again.
    view = RunView.load(
        reader.store,
        cache.record,
        rollouts=cache.rollouts,
        metrics=LogReadResult(list(cache.metrics.records), list(cache.metrics.bad_lines)),
        events=LogReadResult(list(cache.events.records), list(cache.events.bad_lines)),
    )
    sections, figures = [], {}
    for key, title, build in BUILDERS:
        if key == "header":
            continue
        try:
            built = build(view)
        except (ReprorlError, OSError, ValueError, KeyError, TypeError) as exc:
            why = f"Could not be built from the records: {type(exc).__name__}: {exc}"
            built = Section(key, title, (none_line(why),), False)
        one, charts = _section_json(built)
        sections.append(one)
        figures.update(charts)
    return {"sections": sections, "figures": figures}


@router.get("/api/runs/{run_id}/sections")
def api_sections(request: Request, run_id: str) -> dict[str, Any]:
    reader = reader_of(request)
    cache = reader.run(run_id)
    built = cache.built("sections", lambda: built_sections(reader, cache))
    return {**snapshot(cache), **built}


@router.get("/api/runs/{run_id}/stream")
async def api_stream(request: Request, run_id: str) -> StreamingResponse:
    """Server-sent events: `update` with the run's snapshot each time its logs or status change."""
    reader = reader_of(request)
    cache = await off_loop(reader.run, run_id)
    interval: float = request.app.state.poll_s

    async def updates() -> AsyncIterator[str]:
        last: dict[str, Any] | None = None
        quiet = 0.0
        # A stream ends after STREAM_S (the browser reconnects by itself), so that no open page holds
        # the server's shutdown.
        ends = asyncio.get_running_loop().time() + STREAM_S
        while not await request.is_disconnected() and asyncio.get_running_loop().time() < ends:
            await off_loop(cache.refresh)
            now = await off_loop(snapshot, cache)
            if now != last:
                yield f"event: update\ndata: {json.dumps(now)}\n\n"
                last, quiet = now, 0.0
                if now["status"] in FINAL_STATUSES:
                    yield "event: done\ndata: {}\n\n"
                    return
            elif quiet >= 15.0:
                yield ": still here\n\n"  # keeps proxies from closing an idle stream
                quiet = 0.0
            await asyncio.sleep(interval)
            quiet += interval

    return StreamingResponse(updates(), media_type="text/event-stream", headers={"x-accel-buffering": "no"})
