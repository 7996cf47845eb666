"""Report page: sections as HTML and the single self-contained document that holds them.

The document inlines plotly.js and its own styles and names no other resource; its content security
policy forbids every fetch, so opening it never reaches the network. Nothing in it depends on when
or where it was rendered, so the same records give the same bytes.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache

from reprorl.report.charts import Chart

CHARTS_META = "reprorl-report-charts"
# No fetch of any kind; inline scripts and styles only (plotly.js adds style elements at runtime).
CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src 'none'; connect-src 'none'; base-uri 'none'; form-action 'none'"
)
CSS = """
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0;
  color: #111827; background: #f9fafb; line-height: 1.45; }
header.top { background: #111827; color: #f9fafb; padding: 18px 32px; }
header.top h1 { margin: 0; font-size: 22px; }
header.top p { margin: 4px 0 0; color: #d1d5db; font-size: 13px; }
nav { padding: 10px 32px; background: #e5e7eb; font-size: 13px; }
nav a { margin-right: 14px; color: #1f2937; }
main { padding: 8px 32px 40px; max-width: 1280px; }
section { background: white; border: 1px solid #e5e7eb; border-radius: 6px; margin: 18px 0;
  padding: 12px 20px 18px; }
section h2 { font-size: 18px; margin: 4px 0 10px; }
h3 { font-size: 15px; margin: 16px 0 6px; }
p.none { color: #6b7280; font-style: italic; }
p.note { color: #4b5563; font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0 12px; }
th, td { border: 1px solid #e5e7eb; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f4f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 3px 16px; font-size: 13px; }
dl.facts dt { color: #4b5563; }
dl.facts dd { margin: 0; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; word-break: break-all; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
pre { white-space: pre-wrap; word-break: break-word; background: #f3f4f6; padding: 6px 8px;
  border-radius: 4px; margin: 4px 0; }
.bad { color: #b91c1c; }
.good { color: #15803d; }
article.trajectory { border-top: 1px solid #e5e7eb; padding-top: 6px; }
ol.turns { list-style: none; padding-left: 8px; }
ol.turns > li { margin: 8px 0; }
.tool-call pre { background: #eff6ff; }
.tool-result pre { background: #f0fdf4; }
.tool-result.failed pre { background: #fef2f2; }
.chart { margin: 8px 0; }
"""


@dataclass(frozen=True)
class Section:
    """One part of the report: a title and its content, HTML text and charts in reading order."""

    key: str
    title: str
    parts: tuple[str | Chart, ...]
    has_data: bool = True

    @property
    def charts(self) -> list[Chart]:
        return [p for p in self.parts if isinstance(p, Chart)]

    def html(self) -> str:
        body = "\n".join(p.html() if isinstance(p, Chart) else p for p in self.parts)
        return f'<section id="sec-{self.key}">\n<h2>{esc(self.title)}</h2>\n{body}\n</section>'

    def summary(self) -> dict[str, object]:
        return {"key": self.key, "title": self.title, "charts": len(self.charts), "has_data": self.has_data}


def esc(text: object) -> str:
    """Any record text as HTML text: a trajectory's model output is arbitrary."""
    return html.escape(str(text), quote=True)


def no_data(key: str, title: str, reason: str) -> Section:
    """A section that has nothing to show, saying so in one line."""
    return Section(key, title, (none_line(reason),), has_data=False)


def none_line(text: str) -> str:
    return f'<p class="none">{esc(text)}</p>'


def note(text: str) -> str:
    return f'<p class="note">{esc(text)}</p>'


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """An HTML table; cells are HTML already (escape record text with `esc` before)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def facts(items: Iterable[tuple[str, str]]) -> str:
    """A definition list of (label, HTML value) pairs."""
    inner = "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in items)
    return f'<dl class="facts">{inner}</dl>'


@cache
def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return str(get_plotlyjs())


def document(run_id: str, title: str, subtitle: str, sections: Sequence[Section], footer: str) -> str:
    """The whole report page: plotly.js inlined, one anchor per section, every chart counted."""
    charts = sum(len(s.charts) for s in sections)
    ids = [c.div_id for s in sections for c in s.charts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"chart ids must be unique, got {ids}")
    nav = "".join(f'<a href="#sec-{s.key}">{esc(s.title)}</a>' for s in sections)
    body = "\n".join(s.html() for s in sections)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<meta name="{CHARTS_META}" content="{charts}">\n'
        '<link rel="icon" href="data:,">\n'
        f"<title>{esc(title)}</title>\n"
        f"<style>{CSS}</style>\n"
        f'<script type="text/javascript">{plotly_js()}</script>\n'
        "</head>\n"
        f'<body data-run="{esc(run_id)}" data-charts="{charts}">\n'
        f'<header class="top"><h1>{esc(title)}</h1><p>{esc(subtitle)}</p></header>\n'
        f"<nav>{nav}</nav>\n<main>\n{body}\n</main>\n"
        f'<footer><p class="note" style="padding: 0 32px 24px">{esc(footer)}</p></footer>\n'
        "</body>\n</html>\n"
    )
