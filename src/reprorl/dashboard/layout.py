"""Dashboard pages: the shell every page shares (navigation, styles, scripts), all text escaped.

Pages are rendered on the server from the records, every record text through `esc`; the scripts
only fetch JSON from this origin and draw charts or replace parts with HTML the server rendered.
No page holds an inline script, and the content security policy allows none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fastapi.responses import HTMLResponse

from reprorl.report.page import esc
from reprorl.version import __version__

NAV = (("runs", "/", "Runs"), ("compare", "/compare", "Compare"), ("artifacts", "/artifacts", "Artifacts"))


def page(
    title: str,
    body: str,
    *,
    active: str = "",
    data: Mapping[str, str] | None = None,
    charts: bool = False,
    status: int = 200,
) -> HTMLResponse:
    """One whole page; `data` becomes the body's data attributes (what the page's script loads)."""
    attrs = "".join(f' data-{esc(k)}="{esc(v)}"' for k, v in (data or {}).items())
    current = ' class="active"'
    nav = "".join(
        f'<a href="{href}"{current if key == active else ""}>{esc(text)}</a>' for key, href, text in NAV
    )
    scripts = '<script src="/static/plotly.js"></script>' if charts else ""
    text = (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<link rel="icon" href="data:,">\n'
        f"<title>{esc(title)} — reprorl</title>\n"
        '<link rel="stylesheet" href="/static/dashboard.css">\n'
        f"{scripts}"
        '<script src="/static/dashboard.js" defer></script>\n'
        "</head>\n"
        f"<body{attrs}>\n"
        f'<header class="top"><h1>{esc(title)}</h1><p>reprorl {esc(__version__)} · read from the store, '
        "never written</p></header>\n"
        f"<nav>{nav}</nav>\n<main>\n{body}\n</main>\n</body>\n</html>\n"
    )
    return HTMLResponse(text, status_code=status)


def link(href: str, text: str) -> str:
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def section(key: str, title: str, body: str) -> str:
    return f'<section id="sec-{esc(key)}">\n<h2>{esc(title)}</h2>\n{body}\n</section>'


def form(action: str, fields: Iterable[str], submit: str = "Apply") -> str:
    inner = "".join(fields)
    button = f'<button type="submit">{esc(submit)}</button>'
    return f'<form class="filters" method="get" action="{esc(action)}">{inner}{button}</form>'


def text_input(name: str, label: str, value: str | None, *, wide: bool = False, placeholder: str = "") -> str:
    cls = ' class="wide"' if wide else ""
    return (
        f'<label>{esc(label)} <input type="text" name="{esc(name)}" value="{esc(value or "")}"{cls} '
        f'placeholder="{esc(placeholder)}"></label>'
    )


def select(name: str, label: str, options: Iterable[str], value: str | None) -> str:
    opts = ['<option value="">any</option>']
    for option in options:
        chosen = " selected" if option == value else ""
        opts.append(f'<option value="{esc(option)}"{chosen}>{esc(option)}</option>')
    return f'<label>{esc(label)} <select name="{esc(name)}">{"".join(opts)}</select></label>'


def number(value: object, digits: int = 3) -> str:
    """A figure as the record holds it: NaN and missing say so, never 0."""
    if value is None:
        return '<span class="none">—</span>'
    if isinstance(value, bool) or not isinstance(value, int | float):
        return esc(value)
    if value != value:
        return '<span class="bad">NaN</span>'
    return esc(f"{value:.{digits}f}" if isinstance(value, float) else str(value))
