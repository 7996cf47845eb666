"""`reprorl artifacts`: add files and folders under a name, list versions, show one with lineage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.errors import UserInputError
from reprorl.store import ArtifactVersion
from reprorl.store.registry import ARTIFACT_KINDS

app = typer.Typer(help="Versioned, content-addressed artifacts.", no_args_is_help=True)


def _as_dict(version: ArtifactVersion) -> dict[str, Any]:
    return {
        "name": version.name,
        "version": f"v{version.version}",
        "hash": version.hash,
        "ref": version.ref,
        "kind": version.kind,
        "size": version.size,
        "created_at": version.created_at.isoformat(),
        "meta": version.meta,
    }


def _parse_meta(items: list[str]) -> dict[str, str]:
    meta: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserInputError(f"--meta {item!r} must be KEY=VALUE", field="--meta")
        meta[key.strip()] = value
    return meta


@app.command("add")
def add(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Artifact name, e.g. calc-train."),
    path: Path = typer.Argument(..., help="File or folder to store."),
    kind: str | None = typer.Option(None, help=f"One of: {', '.join(ARTIFACT_KINDS)}."),
    meta: list[str] = typer.Option([], "--meta", help="KEY=VALUE metadata (repeatable)."),
    parent: list[str] = typer.Option(
        [], "--parent", help="REF[:RELATION] this artifact was made from (repeatable)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the registered version as JSON."),
) -> None:
    """Store PATH and register it as the newest version of NAME (unchanged content keeps its version)."""
    if kind is not None and kind not in ARTIFACT_KINDS:
        raise UserInputError(
            f"{kind!r} is not a kind; use one of {', '.join(ARTIFACT_KINDS)}", field="--kind"
        )
    if not path.exists():
        raise UserInputError(f"{str(path)!r} does not exist", field="PATH")
    info = _parse_meta(meta)
    store = options(ctx).store()
    parents = []
    for item in parent:  # resolve every parent before anything is written
        ref, _, relation = item.partition(":") if not item.startswith("sha256:") else (item, "", "")
        parents.append((store.resolve(ref).hash, relation or "derived_from"))
    before = {v.hash for v in store.registry.versions(name)} if store.has_registry() else set()
    version = store.add(name, path, kind=kind, meta=info)
    for address, relation in parents:
        store.registry.link(version.hash, address, relation)
    if as_json:
        print_json(_as_dict(version))
        return
    note = " (content unchanged)" if version.hash in before else ""
    console.print(f"{version.label}  {version.hash}  {version.kind}  {version.size} bytes{note}")


@app.command("list")
def list_(
    ctx: typer.Context,
    name: str | None = typer.Argument(None, help="Only versions of this name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List registered artifact versions."""
    store = options(ctx).store()
    versions = store.registry.versions(name) if store.has_registry() else []
    if as_json:
        print_json([_as_dict(v) for v in versions])
        return
    if not versions:
        console.print("no artifacts registered" + (f" under {name!r}" if name else ""))
        return
    table = Table("name", "version", "hash", "kind", "size", "created")
    for v in versions:
        table.add_row(
            v.name,
            f"v{v.version}",
            v.hash[:19] + "…",
            v.kind,
            str(v.size),
            f"{v.created_at:%Y-%m-%d %H:%M}",
        )
    console.print(table)


@app.command("show")
def show(
    ctx: typer.Context,
    ref: str = typer.Argument(..., help="NAME@vN, NAME@sha256:<hash>, or a hash."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    verify: bool = typer.Option(True, help="Re-hash the stored bytes."),
) -> None:
    """Show one artifact version: hash, kind, size, metadata, lineage; verify its bytes."""
    store = options(ctx).store()
    resolved = store.resolve(ref)
    label = resolved.version.label if resolved.version else ref
    is_tree = store.blobs.is_tree(resolved.hash)
    if verify:
        if is_tree:
            for entry in store.blobs.read_tree(resolved.hash, label=label)["entries"]:
                store.blobs.verify(entry["hash"], label=f"{label}/{entry['path']}")
        else:
            store.blobs.verify(resolved.hash, label=label)
    out: dict[str, Any] = _as_dict(resolved.version) if resolved.version else {"hash": resolved.hash}
    out["verified"] = verify
    out["parents"] = [
        {"hash": h, "relation": r, "run_id": run} for h, r, run in store.registry.parents(resolved.hash)
    ]
    out["children"] = [
        {"hash": h, "relation": r, "run_id": run} for h, r, run in store.registry.children(resolved.hash)
    ]
    if is_tree:
        out["files"] = [e["path"] for e in store.blobs.read_tree(resolved.hash, label=label)["entries"]]
    if as_json:
        print_json(out)
        return
    for key in ("name", "version", "hash", "kind", "size", "created_at", "verified"):
        if key in out:
            console.print(f"{key:<11} {out[key]}")
    for key in ("parents", "children"):
        for link in out[key]:
            console.print(
                f"{key[:-1]:<11} {link['relation']}: {link['hash']}"
                + (f" (run {link['run_id']})" if link["run_id"] else "")
            )
    if out.get("meta"):
        console.print(f"{'meta':<11} {out['meta']}")
    if is_tree:
        files = out["files"]
        more = " …" if len(files) > 8 else ""
        console.print(f"{'files':<11} {len(files)}: {', '.join(files[:8])}{more}")
