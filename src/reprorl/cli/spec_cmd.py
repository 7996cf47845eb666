"""`reprorl spec`: check a run spec and pin every reference in it to an exact content hash."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.config import RunSpec, is_resolved, iter_refs, load_spec, resolve_spec
from reprorl.config.limits import dotted
from reprorl.errors import ReprorlError
from reprorl.hashing import HASH_PREFIX, canonical_json
from reprorl.store import Store

app = typer.Typer(help="Validate and resolve run specs.", no_args_is_help=True)

FILE = typer.Argument(..., help="Run spec (TOML).", exists=False, dir_okay=False)
OVERRIDES = typer.Argument(None, help="Dotted overrides, e.g. learning.lr=1e-5 seed=3.")


def _summary(spec: RunSpec) -> dict[str, object]:
    refs = {dotted(path): str(ref) for path, ref in iter_refs(spec)}
    return {
        "name": spec.name,
        "seed": spec.seed,
        "owners": {
            "model": spec.model.owner,
            "data": spec.data.owner,
            "learning": spec.learning.owner,
            "evaluation": spec.evaluation.owner,
        },
        "references": refs,
        "resolved": is_resolved(spec),
        "spec_hash": spec.spec_hash() if is_resolved(spec) else None,
    }


# Stands in for a bare name's version while the spec's types are checked; never stored or shown.
_UNPINNED = "@v1"


def _pinning(store: Store) -> tuple[Callable[[str], str], dict[str, str | None]]:
    """A `pin_bare` that notes what each bare name would pin to in `store` (None: not registered),
    as `reprorl run` pins it, without writing anything."""
    pins: dict[str, str | None] = {}

    def pin(ref: str) -> str:
        try:
            pins[ref] = store.pin_newest(ref) if store.has_registry() else None
        except (ReprorlError, KeyError, ValueError):
            pins[ref] = None
        return pins[ref] or f"{ref}{_UNPINNED}"

    return pin, pins


@app.command("validate")
def validate(
    ctx: typer.Context,
    file: Path = FILE,
    overrides: list[str] | None = OVERRIDES,
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
) -> None:
    """Check a spec's syntax, types and references as `reprorl run` reads them, writing nothing.

    A bare name (no @version) is valid, as `run` pins it to its newest registered hash: each one is
    listed with the hash it would pin to in this store, or as not registered (then `run` refuses it).
    """
    pin, pins = _pinning(options(ctx).store())
    spec = load_spec(file, overrides or [], pin_bare=pin)
    summary = _summary(spec)
    names = {bare: pinned for bare, pinned in pins.items()}
    refs = summary["references"]
    assert isinstance(refs, dict)
    for field, ref in list(refs.items()):
        bare = ref.removesuffix(_UNPINNED)
        if bare in names and names[bare] is None and ref.endswith(_UNPINNED):
            refs[field] = bare
    summary["bare_names"] = names
    summary["resolved"] = summary["resolved"] and all(names.values())
    if not summary["resolved"]:
        summary["spec_hash"] = None
    if as_json:
        print_json(summary)
        return
    state = f"resolved, hash {summary['spec_hash']}" if summary["resolved"] else "references not yet pinned"
    console.print(f"ok: {file} — run '{spec.name}', seed {spec.seed}, {len(refs)} references ({state})")
    for bare, pinned in sorted(names.items()):
        where = (
            f"pins to {pinned}" if pinned else "is not registered in this store (`reprorl run` refuses it)"
        )
        console.print(f"  {bare} {where}")


@app.command("resolve")
def resolve(
    ctx: typer.Context,
    file: Path = FILE,
    overrides: list[str] | None = OVERRIDES,
    as_json: bool = typer.Option(False, "--json", help="Print the resolved spec as JSON."),
    save: bool = typer.Option(False, "--save", help="Store the resolved spec as artifact 'spec/NAME'."),
    pin_newest: bool = typer.Option(
        False,
        "--pin-newest",
        help="Resolve bare names (no @version) to their newest registered hash.",
    ),
) -> None:
    """Pin every artifact reference to its content hash; print the spec and its hash.

    Only hashes are stored: a bare name allowed by --pin-newest is replaced by the hash it
    points to now, so the resolved spec cannot drift when the name gets a new version.
    """
    store = options(ctx).store()
    spec = load_spec(file, overrides or [], pin_bare=store.pin_newest if pin_newest else None)
    resolved = resolve_spec(spec, store.pin)
    digest = resolved.spec_hash()
    data = resolved.model_dump(mode="json")
    if save:
        # Every reference is pinned now, so its hash is known without a lookup; looking it up
        # after the write could fail (an unregistered bare hash) and leave a half-saved spec.
        uses = [f"{HASH_PREFIX}{ref.parsed.digest}" for _, ref in iter_refs(resolved)]
        version = store.add_bytes(
            f"spec/{resolved.name}",
            canonical_json(data).encode(),
            kind="spec",
            meta={"spec_hash": digest},
        )
        for address in uses:
            store.registry.link(version.hash, address, "uses")
    if as_json:
        print_json({"spec_hash": digest, "spec": data})
        return
    for path, ref in iter_refs(resolved):
        console.print(f"{dotted(path):<28} {ref}")
    console.print(f"spec hash: {digest}")
