"""Compare: runs side by side — what differs in their conditions first, then their curves and eval deltas.

The first run named is the baseline: every other run is diffed against it (`reprorl diff`'s own
`diff_runs`), its curves drawn over the baseline's, and its last eval points paired with the
baseline's on each suite both measured (B - A with interval and p-value, or why they cannot be).
"""

from __future__ import annotations

import json
from typing import Any

import plotly.io as pio
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from reprorl.audit.diff import Condition, RunDiff, diff_runs
from reprorl.audit.suite_deltas import SuiteDelta
from reprorl.dashboard.layout import link, number, page, section
from reprorl.dashboard.reader import RunCache
from reprorl.dashboard.runs_pages import reader_of
from reprorl.dashboard.security import refuse
from reprorl.report.charts import Chart, band_chart
from reprorl.report.page import esc, none_line, note, table
from reprorl.report.series import Band, eval_band, eval_points, metric_band

router = APIRouter()
MAX_RUNS = 6


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return f"<code>{esc(text if len(text) <= 300 else text[:300] + '…')}</code>"


def _conditions(title: str, conditions: tuple[Condition, ...], a: str, b: str) -> str:
    if not conditions:
        return ""
    rows = [
        [esc(c.group), f'<code class="field">{esc(c.field)}</code>', _value(c.a), _value(c.b), esc(c.note)]
        for c in conditions
    ]
    return f"<h3>{esc(title)}</h3>" + table(["group", "field", a, b, "note"], rows)


def _suite(delta: SuiteDelta) -> list[str]:
    def side(s: Any) -> str:
        if s is None:
            return '<span class="none">not evaluated</span>'
        interval = f"[{number(s.figure('success_low'), 2)}, {number(s.figure('success_high'), 2)}]"
        return f"{number(s.figure('success'))} {interval} · {esc(s.version)} step {esc(s.step)}"

    if delta.difference is not None:
        d = delta.difference
        interval = f"[{number(d.estimate.low, 2)}, {number(d.estimate.high, 2)}]"
        paired = (
            f"{number(d.estimate.value)} {interval} p = {number(d.p_value, 3)} over {esc(d.estimate.n)} tasks"
        )
    else:
        paired = f'<span class="none">{esc(delta.reason or "not paired")}</span>'
    return [esc(delta.suite.split("@", 1)[0]), side(delta.a), side(delta.b), paired]


def _diff_html(diff: RunDiff, label_a: str, label_b: str) -> str:
    parts = [
        f'<p class="diff-summary">{len(diff.conditions)} '
        f"{'condition differs' if len(diff.conditions) == 1 else 'conditions differ'}"
        f"{f', {len(diff.derived)} more follow from them' if diff.derived else ''}.</p>"
    ]
    if not diff.conditions and not diff.derived:
        parts.append(
            note("The runs' recorded conditions are the same: any difference in their figures is noise.")
        )
    parts.append(_conditions("Conditions that differ", diff.conditions, label_a, label_b))
    parts.append(_conditions("Differences that follow from them", diff.derived, label_a, label_b))
    parts.append(_conditions("Labels (names, owners: no effect on behaviour)", diff.labels, label_a, label_b))
    rows = [_suite(m) for m in diff.metrics]
    parts.append("<h3>Eval, paired on the same tasks (B - A)</h3>")
    parts.append(
        table(["suite", label_a, label_b, "B - A [95% CI]"], rows)
        if rows
        else none_line("Neither run has an eval point.")
    )
    return "\n".join(parts)


def _curves(caches: list[RunCache], names: list[str]) -> list[Chart]:
    reward, success, evals = [], [], []
    for cache, name in zip(caches, names, strict=True):
        train = cache.train_lines()
        reward.append(_renamed(metric_band(train, "reward_mean"), name))
        success.append(_renamed(metric_band(train, "success"), name))
        for suite, lines in eval_points(cache.eval_lines()).items():
            evals.append(_renamed(eval_band(suite, lines), f"{name} · {suite}"))
    charts = [
        band_chart("cmp-reward", "Train reward (mean per step)", reward, "reward"),
        band_chart("cmp-success", "Train success", success, "success", unit_range=True),
    ]
    if evals:
        charts.append(band_chart("cmp-eval", "Eval success, 95% CI", evals, "success", unit_range=True))
    return charts


def _renamed(band: Band, name: str) -> Band:
    return Band(name, band.x, band.y, band.low, band.high)


def run_names(runs: list[str]) -> list[str]:
    ids: list[str] = []
    for value in runs:
        ids += [v.strip() for v in value.split(",") if v.strip()]
    return list(dict.fromkeys(ids))


@router.get("/compare", response_class=HTMLResponse)
def compare(request: Request) -> HTMLResponse:
    """`?runs=A&runs=B…` (the run list's form) or `?runs=A,B`; the first is the baseline."""
    reader = reader_of(request)
    ids = run_names(request.query_params.getlist("runs"))
    if len(ids) > MAX_RUNS:
        raise refuse("runs", f"compare at most {MAX_RUNS} runs at once, not {len(ids)}")
    caches = [reader.run(i) for i in ids]
    if len(caches) < 2:
        picked = "".join(f"<li>{link(f'/runs/{c.record.run_id}', c.record.run_id)}</li>" for c in caches)
        body = section(
            "compare",
            "Compare runs",
            (f"<ul>{picked}</ul>" if picked else "")
            + note("Pick two or more runs: tick them on the run list and press Compare.")
            + f"<p>{link('/', '→ the run list')}</p>",
        )
        return page("Compare", body, active="compare")
    names = [
        f"{'AB'[i] if i < 2 else chr(65 + i)}: {c.info().get('name', '')} ({c.record.run_id[-6:]})"
        for i, c in enumerate(caches)
    ]
    parts = []
    base = caches[0]
    for cache, name in zip(caches[1:], names[1:], strict=True):
        diff = diff_runs(reader.store, base.record, cache.record)
        title = f"{names[0]} → {name}"
        parts.append(
            section(
                f"diff-{cache.record.run_id}",
                title,
                _diff_html(diff, "A " + base.record.run_id, "B " + cache.record.run_id),
            )
        )
    charts = _curves(caches, names)
    figures = {c.div_id: json.loads(pio.to_json(c.figure, validate=False)) for c in charts}
    divs = "".join(f'<div class="chart"><div class="plot" id="{esc(c.div_id)}"></div></div>' for c in charts)
    parts.append(section("curves", "Curves, overlaid", divs))
    data = json.dumps(figures, separators=(",", ":")).replace("<", "\\u003c")
    parts.append(f'<script type="application/json" id="figures">{data}</script>')
    legend = "".join(
        f"<li>{esc(n)}: {link(f'/runs/{c.record.run_id}', c.record.run_id)}</li>"
        for n, c in zip(names, caches, strict=True)
    )
    head = section(
        "runs",
        "Runs",
        f"<ul>{legend}</ul>" + note("The first run is the baseline (A); each other run is compared with it."),
    )
    return page("Compare", head + "\n".join(parts), active="compare", charts=True, data={"page": "compare"})
