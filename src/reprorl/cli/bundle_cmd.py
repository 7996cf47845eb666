"""`reprorl runs export | import | verify | keygen`: a run as one portable, verifiable bundle file."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.errors import UserInputError
from reprorl.store import find_run


class Versions(enum.StrEnum):
    all = "all"
    ends = "ends"
    none = "none"


def export(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="Run id or a unique prefix of it."),
    out: Path = typer.Option(
        Path(), "--out", "-o", help="The bundle file, or a folder to write RUN_ID-IDPREFIX.tar into."
    ),
    with_models: bool = typer.Option(
        False, "--with-models", help="Carry the base models' bytes too (else their hash and source)."
    ),
    checkpoints: bool = typer.Option(False, "--checkpoints", help="Carry the resumable checkpoints too."),
    versions: Versions = typer.Option(
        Versions.ends,
        "--versions",
        help="Which kept policy versions' tensors to carry: all (any rollout replays from the bundle), "
        "ends (the starting and the final policy), none. A rerun makes the others again.",
    ),
    sign: Path | None = typer.Option(None, "--sign", help="Sign with this ed25519 key (`runs keygen`)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Write the run's records, the artifacts it used and made, and its code state into one file."""
    from reprorl.portable import export_bundle
    from reprorl.portable.models import package_of

    store = options(ctx).store()
    record = find_run(store, run)
    done = export_bundle(
        store,
        record.run_id,
        out,
        with_models=with_models,
        checkpoints=checkpoints,
        policy_versions=versions.value,
        model_package=package_of,
        sign_with=sign,
    )
    value: dict[str, Any] = {
        "run_id": record.run_id,
        "bundle": done.bundle_id,
        "path": str(done.path),
        "bytes": done.size,
        "members": done.members,
        "models": [m.model_dump(mode="json") for m in done.models],
        "notes": list(done.notes),
        "signer": done.signer,
        "versions": versions.value,
        "versions_left_out": list(done.left_out),
        "derived": done.derived,
    }
    if as_json:
        print_json(value)
        return
    console.print(f"{record.run_id} → {done.path}: {done.members} members, {done.size / 1e6:.1f} MB")
    if done.left_out:
        console.print(
            f"--versions {versions.value}: {len(done.left_out)} kept policy versions left out "
            "(`--versions all` carries every one, so any rollout replays from the bundle)"
        )
    console.print(f"bundle {done.bundle_id}" + (f", signed by {done.signer}" if done.signer else ""))
    for model in done.models:
        where = "included" if model.included else "by hash only"
        source = f" (ships in {model.package}=={model.package_version})" if model.package else ""
        console.print(f"base model {model.name} {model.hash}: {where}{source}")
    for note in done.notes:
        console.print(f"[yellow]note:[/] {note}")


def import_(
    ctx: typer.Context,
    bundle: Path = typer.Argument(..., help="A bundle file written by `reprorl runs export`."),
    signer: str | None = typer.Option(
        None, "--signer", help="Refuse the bundle unless this key id signed it (ed25519:...)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Verify every member of the bundle, then store and register its run in this store."""
    from reprorl.portable import import_bundle, read_bundle
    from reprorl.portable.models import find_model

    store = options(ctx).store()
    if signer is not None:
        _require_signer(read_bundle(bundle).signer, signer)
    done = import_bundle(store, bundle, find_model=find_model)
    value = {
        "run_id": done.run_id,
        "bundle": done.bundle_id,
        "signer": done.signer,
        "artifacts": list(done.artifacts),
        "renumbered": list(done.renumbered),
        "models_from_packages": list(done.models_from_packages),
    }
    if as_json:
        print_json(value)
        return
    console.print(f"imported run {done.run_id} from bundle {done.bundle_id} into {store.root}")
    if done.signer:
        console.print(f"signed by {done.signer}")
    console.print(f"artifacts: {', '.join(done.artifacts) or 'none'}")
    for line in (*done.renumbered, *(f"base model {m}" for m in done.models_from_packages)):
        console.print(f"  {line}")


def verify(
    bundle: Path = typer.Argument(..., help="A bundle file written by `reprorl runs export`."),
    signer: str | None = typer.Option(
        None, "--signer", help="Fail unless this key id signed it (ed25519:...)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Check every member against the manifest and the records' checksums, then answer the audit's
    questions from the bundle alone; exit 1 when a question fails."""
    from reprorl.portable.models import find_model
    from reprorl.portable.verify import verify_bundle

    done = verify_bundle(bundle, find_model=find_model)
    if signer is not None:
        _require_signer(done.signer, signer)
    if as_json:
        print_json(
            {
                "bundle": done.bundle_id,
                "run_id": done.manifest.run_id,
                "members": len(done.manifest.members) + 1,
                "signer": done.signer,
                "audit": done.audit.to_json(),
            }
        )
    else:
        console.print(
            f"{bundle}: {len(done.manifest.members) + 1} members match their manifest; "
            f"bundle {done.bundle_id}, run {done.manifest.run_id}"
        )
        console.print(f"signed by {done.signer}" if done.signer else "not signed")
        if done.manifest.left_out:
            console.print(
                f"[yellow]note:[/] exported with --versions {done.manifest.versions}: "
                f"{len(done.manifest.left_out)} policy versions are not in the bundle, so question 9 "
                "replays only rollouts of the others; `reprorl reproduce --bundle` trains them again"
            )
        for answer in done.audit.answers:
            console.print(f"  {answer.status} {answer.number}. {answer.question}")
            for line in answer.missing:
                console.print(f"       {line}")
        console.print(done.audit.summary())
    if not done.audit.passed:
        raise typer.Exit(1)


def keygen(
    path: Path = typer.Argument(..., help="A new file for the private key (kept owner-only)."),
) -> None:
    """Make an ed25519 signing key for `runs export --sign`; prints the key id verifiers check."""
    from reprorl.portable.signing import new_key

    console.print(f"{path}: {new_key(path)}")


def _require_signer(actual: str | None, wanted: str) -> None:
    if actual != wanted:
        found = f"signed by {actual}" if actual else "not signed"
        raise UserInputError(f"the bundle is {found}, not by {wanted}", field="--signer")
