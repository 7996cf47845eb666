"""Artifacts and lineage: task sets, models and adapters by name and version, and what made and used them.

The lineage page draws one artifact (or one run) in the middle, what it was made from on the left and
what was made from it — or, for a run, what it consumed and produced — on the right, as an SVG whose
every label is escaped text.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from reprorl.dashboard.layout import form, link, page, section, text_input
from reprorl.dashboard.runs_pages import reader_of
from reprorl.dashboard.security import checked_run_id, refuse
from reprorl.errors import ReprorlError, UserInputError
from reprorl.hashing import HASH_PREFIX
from reprorl.refs import check_name
from reprorl.report.page import esc, none_line, note, table
from reprorl.store import ArtifactVersion, Store

router = APIRouter()
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Node:
    """One box of the lineage graph: what it says, where it links, and the edge's label."""

    label: str
    href: str
    relation: str = ""


def _versions(store: Store, name: str | None = None) -> list[ArtifactVersion]:
    return store.registry.versions(name) if store.has_registry() else []


def _checked_hash(value: str) -> str:
    digest = value.removeprefix(HASH_PREFIX)
    if len(digest) != 64 or not set(digest) <= _HEX:
        raise refuse("hash", f"{value[:80]!r} is not sha256:<64 hex>")
    return HASH_PREFIX + digest


def _label(store: Store, address: str) -> str:
    digest = address.rsplit("@", 1)[-1].removeprefix(HASH_PREFIX)
    if store.has_registry():
        try:
            return store.registry.lookup(None, digest=digest).label
        except ReprorlError:
            pass
    return address if len(address) < 24 else address[:19] + "…"


def _hash_node(store: Store, address: str, relation: str = "") -> Node:
    digest = address.rsplit("@", 1)[-1]
    return Node(_label(store, address), f"/lineage?hash={digest}", relation)


@router.get("/artifacts", response_class=HTMLResponse)
def artifacts(request: Request, name: str = "") -> HTMLResponse:
    store = reader_of(request).store
    search = form("/artifacts", [text_input("name", "name", name)], "Show")
    if name:
        try:
            check_name(name)
        except UserInputError as exc:
            raise refuse("name", str(exc)) from None
        versions = _versions(store, name)
        if not versions:
            raise refuse("name", f"no artifact named {name[:128]!r}", status=404)
        rows = [
            [
                esc(f"v{v.version}"),
                esc(v.kind),
                f'<a href="/lineage?hash={esc(v.hash)}"><code>{esc(v.hash)}</code></a>',
                esc(v.size),
                esc(v.created_at.isoformat()[:19]),
                f"<code>{esc(v.meta)}</code>",
            ]
            for v in sorted(versions, key=lambda v: -v.version)
        ]
        body = table(
            ["version", "kind", "hash (→ lineage)", "bytes", "registered", "meta"], rows, numeric=[3]
        )
        return page(
            f"Artifact {name}",
            search + section("versions", f"{name}: {len(versions)} versions", body),
            active="artifacts",
        )
    latest: dict[str, ArtifactVersion] = {}
    counts: dict[str, int] = {}
    for v in _versions(store):
        counts[v.name] = counts.get(v.name, 0) + 1
        if v.name not in latest or v.version > latest[v.name].version:
            latest[v.name] = v
    rows = [
        [
            link(f"/artifacts?name={n}", n),
            esc(v.kind),
            esc(counts[n]),
            esc(f"v{v.version}"),
            f"<code>{esc(v.hash[:19])}…</code>",
            esc(v.created_at.isoformat()[:19]),
        ]
        for n, v in sorted(latest.items())
    ]
    body = (
        table(["name", "kind", "versions", "latest", "hash", "registered"], rows, numeric=[2])
        if rows
        else none_line("No artifacts registered.")
    )
    return page(
        "Artifacts", search + section("artifacts", f"Artifacts ({len(rows)})", body), active="artifacts"
    )


def graph(left: list[Node], centre: Node, right: list[Node], left_title: str, right_title: str) -> str:
    """Three columns of boxes, an edge from each side box to the centre, labels as escaped SVG text."""
    box_w, box_h, gap, col = 260, 30, 12, 360
    rows = max(len(left), len(right), 1)
    height = 40 + rows * (box_h + gap)
    centre_y = 40 + (rows * (box_h + gap) - gap) / 2 - box_h / 2
    out = [
        f'<svg class="lineage" xmlns="http://www.w3.org/2000/svg" width="{2 * col + box_w}" '
        f'height="{height}" role="img">'
    ]
    out.append(f'<text x="0" y="20" class="col-title">{esc(left_title)}</text>')
    out.append(f'<text x="{2 * col}" y="20" class="col-title">{esc(right_title)}</text>')

    def box(node: Node, x: float, y: float, css: str) -> None:
        text = node.label if len(node.label) <= 38 else node.label[:37] + "…"
        out.append(
            f'<a href="{esc(node.href)}"><rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" '
            f'rx="4" class="{css}"/>'
        )
        out.append(f'<text x="{x + 8}" y="{y + 19}">{esc(text)}</text><title>{esc(node.label)}</title></a>')

    for i, n in enumerate(left):
        y = 40 + i * (box_h + gap)
        out.append(f'<line x1="{box_w}" y1="{y + box_h / 2}" x2="{col}" y2="{centre_y + box_h / 2}"/>')
        if n.relation:
            out.append(f'<text x="{box_w + 6}" y="{y + box_h / 2 - 4}" class="rel">{esc(n.relation)}</text>')
        box(n, 0, y, "side")
    for i, n in enumerate(right):
        y = 40 + i * (box_h + gap)
        out.append(
            f'<line x1="{col + box_w}" y1="{centre_y + box_h / 2}" x2="{2 * col}" y2="{y + box_h / 2}"/>'
        )
        if n.relation:
            out.append(
                f'<text x="{2 * col - 90}" y="{y + box_h / 2 - 4}" class="rel">{esc(n.relation)}</text>'
            )
        box(n, 2 * col, y, "side")
    box(centre, col, centre_y, "centre")
    out.append("</svg>")
    return "".join(out)


@router.get("/lineage", response_class=HTMLResponse)
def lineage(request: Request, hash: str = "", run: str = "") -> HTMLResponse:
    reader = reader_of(request)
    store = reader.store
    if run:
        cache = reader.run(checked_run_id(run))
        inputs = (cache.info().get("inputs") or {}) if cache else {}
        used = [_hash_node(store, str(a), str(role)) for role, a in sorted(inputs.items())]
        made = [
            _hash_node(store, child, rel)
            for child, _parent, rel in (store.registry.made_by_run(run) if store.has_registry() else [])
        ]
        made = list({n.href: n for n in made}.values())
        centre = Node(f"run {cache.info().get('name', '')} {run[-6:]}", f"/runs/{run}")
        svg = graph(used, centre, made, "consumed", "produced")
        rows = [[esc(n.relation), link(n.href, n.label)] for n in used + made]
        body = svg + table(["role / relation", "artifact"], rows)
        return page(f"Lineage of run {run}", section("lineage", "Lineage", body), active="artifacts")
    if not hash:
        body = note("Open an artifact version (its hash) or a run to see its lineage.")
        return page("Lineage", section("lineage", "Lineage", body), active="artifacts")
    address = _checked_hash(hash)
    if not store.has_registry():
        raise refuse("hash", "this store has no registry yet", status=404)
    parents = [_hash_node(store, p, rel) for p, rel, _ in store.registry.parents(address)]
    children = [_hash_node(store, c, rel) for c, rel, _ in store.registry.children(address)]
    runs = [
        Node(f"run {r[-6:]} ({role})", f"/runs/{r}", role) for r, role in store.registry.runs_using(address)
    ]
    centre = Node(_label(store, address), f"/lineage?hash={address}")
    svg = graph(parents, centre, children + runs, "made from", "made from it / runs that used it")
    listed = [[esc(n.relation), link(n.href, n.label)] for n in parents + children + runs]
    body = svg + (
        table(["relation", "artifact or run"], listed) if listed else none_line("No lineage recorded for it.")
    )
    return page(f"Lineage of {centre.label}", section("lineage", "Lineage", body), active="artifacts")
