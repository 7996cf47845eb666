"""Report charts: plotly figures of the report's series, each placed in a div with a stable id.

The figures carry no script of their own beyond `Plotly.newPlot`: plotly.js is inlined once by the
page, and every text a record supplies (tool, suite and metric names) is HTML-escaped first,
because plotly renders a subset of HTML in labels.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from reprorl.report.series import Band, Point, ToolSeries

PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["sendDataToCloud"]}
TEMPLATE = go.layout.Template(
    layout={
        "font": {"family": "system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif", "size": 12},
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "colorway": list(PALETTE),
        "xaxis": {"gridcolor": "#e5e7eb", "zerolinecolor": "#d1d5db", "linecolor": "#9ca3af"},
        "yaxis": {"gridcolor": "#e5e7eb", "zerolinecolor": "#d1d5db", "linecolor": "#9ca3af"},
        "legend": {"orientation": "h", "y": -0.2},
        "margin": {"l": 60, "r": 20, "t": 50, "b": 60},
    }
)


@dataclass(frozen=True)
class Chart:
    """One plotly figure and the id of the div it is drawn in."""

    div_id: str
    figure: go.Figure

    def html(self) -> str:
        # Ids are given, never generated, so the same records give the same bytes.
        text = pio.to_html(
            self.figure,
            config=CONFIG,
            include_plotlyjs=False,
            include_mathjax=False,
            full_html=False,
            div_id=self.div_id,
            default_height=f"{self.figure.layout.height}px",
        )
        return f'<div class="chart" data-chart="{html.escape(self.div_id)}">{text}</div>'


def label(text: str) -> str:
    """Record text as a plotly label: escaped, so it is shown as written and never as markup."""
    return html.escape(text, quote=False)


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def band_traces(band: Band, i: int, *, legend: str | None = None, show_legend: bool = True) -> list[Any]:
    """The line of a band and, where it has an interval, a shaded 95% region behind it."""
    traces: list[Any] = []
    name = label(band.name)
    group = legend or name
    if band.low is not None and band.high is not None and any(v is not None for v in band.low):
        traces.append(
            go.Scatter(
                x=band.x,
                y=band.high,
                mode="lines",
                line={"width": 0},
                hoverinfo="skip",
                showlegend=False,
                legendgroup=group,
                name=f"{name} 95% high",
            )
        )
        traces.append(
            go.Scatter(
                x=band.x,
                y=band.low,
                mode="lines",
                line={"width": 0},
                fill="tonexty",
                fillcolor=rgba(color(i), 0.18),
                hoverinfo="skip",
                showlegend=False,
                legendgroup=group,
                name=f"{name} 95% low",
            )
        )
    custom = [[lo, hi] for lo, hi in zip(band.low or [], band.high or [], strict=True)] or None
    hover = "step %{x}: %{y:.4g}" + (" [%{customdata[0]:.3g}, %{customdata[1]:.3g}]" if custom else "")
    traces.append(
        go.Scatter(
            x=band.x,
            y=band.y,
            mode="lines+markers",
            name=name,
            line={"color": color(i)},
            legendgroup=group,
            showlegend=show_legend,
            customdata=custom,
            hovertemplate=hover + f"<extra>{name}</extra>",
        )
    )
    return traces


def _layout(figure: go.Figure, title: str, height: int, y_title: str | None = None) -> go.Figure:
    figure.update_layout(template=TEMPLATE, title={"text": label(title)}, height=height, hovermode="closest")
    steps = [x for trace in figure.data for x in (trace.x or ()) if isinstance(x, int)]
    # Steps are whole numbers: ticks at whole steps only, about ten of them at most.
    every = max(1, math.ceil(max(steps, default=0) / 10))
    figure.update_xaxes(title_text="step", tick0=0, dtick=every, rangemode="tozero")
    if y_title:
        figure.update_yaxes(title_text=label(y_title))
    return figure


def band_chart(
    div_id: str, title: str, bands: Sequence[Band], y_title: str, unit_range: bool = False
) -> Chart:
    """Lines with 95% bands, one per series (a series without an interval is a plain line)."""
    figure = go.Figure()
    for i, band in enumerate(bands):
        for trace in band_traces(band, i):
            figure.add_trace(trace)
    if unit_range:
        figure.update_yaxes(range=[-0.02, 1.02])
    return Chart(div_id, _layout(figure, title, 380, y_title))


def panels_chart(div_id: str, title: str, panels: Sequence[tuple[str, Sequence[Band]]]) -> Chart:
    """Small line charts side by side, two to a row, one per panel."""
    rows = (len(panels) + 1) // 2
    figure = make_subplots(
        rows=rows,
        cols=2,
        subplot_titles=[label(t) for t, _ in panels],
        vertical_spacing=min(0.12, 0.5 / max(rows, 1)),
        horizontal_spacing=0.1,
    )
    for n, (_, bands) in enumerate(panels):
        for i, band in enumerate(bands):
            # A panel of one key is named by its title; several keys need the legend to tell them apart.
            for trace in band_traces(band, i, legend=f"{n}-{i}", show_legend=len(bands) > 1):
                trace.update(name=label(band.name))
                figure.add_trace(trace, row=n // 2 + 1, col=n % 2 + 1)
    figure = _layout(figure, title, 260 * rows + 120)
    figure.update_layout(legend={"y": -0.05, "yanchor": "top"})
    return Chart(div_id, figure)


def tool_failure_chart(div_id: str, tools: ToolSeries) -> Chart:
    """Failure rate per tool (the loop's own figure) and share of calls per failure class."""
    figure = make_subplots(
        rows=1, cols=2, subplot_titles=["failure rate by tool", "share of calls by failure class"]
    )
    for i, (tool, rates) in enumerate(tools.failure_rate.items()):
        figure.add_trace(_line(tools.steps, rates, tool, i, "tool"), row=1, col=1)
    offset = len(tools.failure_rate)
    for i, (outcome, rates) in enumerate(tools.class_rate.items()):
        figure.add_trace(_line(tools.steps, rates, outcome, offset + i, "class"), row=1, col=2)
    figure = _layout(figure, "tool failures per step", 420)
    figure.update_yaxes(range=[-0.02, 1.02], title_text="rate")
    return Chart(div_id, figure)


def _line(x: Sequence[int], y: Sequence[Point], name: str, i: int, kind: str) -> Any:
    text = label(name)
    return go.Scatter(
        x=list(x),
        y=list(y),
        mode="lines+markers",
        name=f"{text} ({kind})",
        line={"color": color(i)},
        hovertemplate=f"step %{{x}}: %{{y:.3g}}<extra>{text}</extra>",
    )


def stacked_chart(
    div_id: str, title: str, x: Sequence[int], stacks: Mapping[str, Sequence[float]], y_title: str
) -> Chart:
    """Bars per step, one colour per series, stacked."""
    figure = go.Figure()
    for i, (name, values) in enumerate(stacks.items()):
        text = label(name)
        figure.add_trace(
            go.Bar(
                x=list(x),
                y=list(values),
                name=text,
                marker={"color": color(i)},
                hovertemplate=f"step %{{x}}: %{{y:.4g}}<extra>{text}</extra>",
            )
        )
    figure.update_layout(barmode="stack", showlegend=True)  # even one series is named
    return Chart(div_id, _layout(figure, title, 380, y_title))


def cost_chart(
    div_id: str, x: Sequence[int], rows: Sequence[tuple[str, str, Mapping[str, Sequence[float]]]]
) -> Chart:
    """Stacked bars per step in rows sharing the step axis: one row per (title, unit, series)."""
    figure = make_subplots(
        rows=len(rows),
        cols=1,
        shared_xaxes=True,
        subplot_titles=[label(t) for t, _, _ in rows],
        vertical_spacing=0.1,
    )
    names = sorted({name for _, _, stacks in rows for name in stacks})
    for r, (_, unit, stacks) in enumerate(rows, start=1):
        for name, values in stacks.items():
            text = label(name)
            figure.add_trace(
                go.Bar(
                    x=list(x),
                    y=list(values),
                    name=text,
                    legendgroup=text,
                    showlegend=r == 1 or all(name not in s for _, _, s in rows[: r - 1]),
                    marker={"color": color(names.index(name))},
                    hovertemplate=f"step %{{x}}: %{{y:.4g}} {label(unit)}<extra>{text}</extra>",
                ),
                row=r,
                col=1,
            )
        figure.update_yaxes(title_text=label(unit), row=r, col=1)
    figure.update_layout(barmode="stack")
    figure = _layout(figure, "where the time and money went, per step", 260 * len(rows) + 100)
    for r in range(1, len(rows)):  # the rows share one step axis: named once, at the bottom
        figure.update_xaxes(title_text=None, row=r, col=1)
    figure.update_layout(legend={"y": -0.1, "yanchor": "top"})
    return Chart(div_id, figure)
