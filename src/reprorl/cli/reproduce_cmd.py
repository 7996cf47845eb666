"""`reprorl reproduce`: re-run a run from its records and name every difference from the original."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console, err_console, print_json
from reprorl.errors import UserInputError
from reprorl.store import Store, find_run

SHOWN = 20


def reproduce(
    ctx: typer.Context,
    run: str | None = typer.Argument(None, help="The run to reproduce (id or unique prefix)."),
    bundle: Path | None = typer.Option(
        None, "--bundle", help="Import this bundle (`runs export`), check the environment, rebuild its code."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Train the run's recorded spec again; compare metrics and final weights (exit 1 if they differ).

    With --bundle: import the bundle's run into this store, compare this environment with the run's
    package lock, and rerun from its recorded code state (a scratch git worktree) when that is not
    the code here."""
    store = options(ctx).store()
    if bundle is not None:
        if run is not None:
            raise UserInputError("give a RUN or --bundle FILE, not both", field="RUN")
        with tempfile.TemporaryDirectory(prefix="reprorl-reproduce-") as scratch:
            code = _from_bundle(ctx, store, bundle, Path(scratch), as_json)
        raise typer.Exit(code)
    if run is None:
        raise UserInputError("give the RUN to reproduce, or --bundle FILE", field="RUN")
    raise typer.Exit(_reproduce(store, find_run(store, run).run_id, as_json))


def _reproduce(store: Store, run_id: str, as_json: bool) -> int:
    from reprorl.orchestrate.jobs.reproduce import reproduce_run

    result = asyncio.run(reproduce_run(store, run_id, show_progress=not as_json))
    if as_json:
        print_json(result.to_json())
    else:
        for warning in (*result.code_warnings, *result.timing_dependent):
            console.print(f"[yellow]warning:[/] {warning}")
        if result.followed is not None:
            console.print(f"followed the recorded schedule: {result.followed}")
        if result.diverged is not None:
            console.print(f"[yellow]warning:[/] the rerun left the recorded schedule at {result.diverged}")
        verdict = "[green]reproduced exactly[/]" if result.matches else "[red]differs[/]"
        console.print(
            f"{result.rerun} against {result.original}: {verdict} "
            f"({result.lines_compared} metric lines, final weights {result.adapter[1] or 'none'})"
        )
        for d in result.differences[:SHOWN]:
            where = "weights" if d.line < 0 else f"metrics line {d.line}"
            console.print(f"  {where} {d.key}: {d.original!r} then, {d.rerun!r} now")
        if len(result.differences) > SHOWN:
            console.print(f"  … and {len(result.differences) - SHOWN} more (--json lists all)")
    return 0 if result.matches else 1


# The rebuilt checkout's own CLI (`python -m reprorl.cli.main` runs nothing: it has no main guard).
RERUN = "import sys; from reprorl.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _from_bundle(ctx: typer.Context, store: Store, bundle: Path, scratch: Path, as_json: bool) -> int:
    """Import, check the lock, rebuild the code; then reproduce here or from the rebuilt code."""
    from reprorl.portable.models import find_model
    from reprorl.portable.rerun import prepare, remove_worktree

    ready = prepare(store, bundle, scratch, find_model=find_model)
    say = err_console.print if as_json else console.print
    say(f"run {ready.run_id} from bundle {ready.bundle_id}" + (", imported" if ready.imported else ""))
    if ready.python[0] != ready.python[1]:
        say(f"[yellow]warning:[/] Python {ready.python[0]} then, {ready.python[1]} here")
    if ready.package_diff:
        differ = len({line[2:].partition("==")[0] for line in ready.package_diff})
        say(f"[yellow]warning:[/] {differ} package(s) differ from the run's lock:")
        for line in ready.package_diff:
            say(f"  {line}")
    else:
        say("packages match the run's lock")
    for note in ready.code_notes:
        say(f"code: {note}")
    if ready.worktree is None:
        say(
            "code: the recorded state is the code here"
            if ready.code == "here"
            else "code: rerun on the code here"
        )
        return _reproduce(store, ready.run_id, as_json)
    say(f"code: rebuilt at {ready.worktree}")
    try:
        env = {**os.environ, "PYTHONPATH": str(ready.worktree / "src")}
        argv = [sys.executable, "-c", RERUN, *_store_args(ctx), "reproduce", ready.run_id]
        done = subprocess.run(
            [*argv, *(["--json"] if as_json else [])], cwd=ready.worktree, env=env, check=False
        )
        return done.returncode
    finally:
        remove_worktree(ready.worktree)


def _store_args(ctx: typer.Context) -> list[str]:
    opts = options(ctx)
    return ["--home", str(opts.store().root), *(["--db-url", opts.db_url] if opts.db_url else [])]
