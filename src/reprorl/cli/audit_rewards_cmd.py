"""`reprorl audit-rewards`: every exploit probe against each env family's verifier, as a table.

Exit codes: 0 when every verifier passes, 1 when any fails (the table or JSON is printed either
way), 2 for an error such as an unknown family or a verifier that cannot be loaded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib

import typer
from rich.table import Table
from rich.text import Text

from reprorl.cli.output import console, print_json
from reprorl.errors import UserInputError
from reprorl.rewards.base import Verifier

EXIT_FAILED = 1


def load_verifier(text: str) -> tuple[str, Verifier]:
    """`FAMILY=MODULE:NAME` to (family, verifier); NAME is a Verifier instance or a class to build."""
    family, _, path = text.partition("=")
    module_name, _, name = path.partition(":")
    if not family or not module_name or not name:
        raise UserInputError(
            f"--verifier {text!r}: write FAMILY=MODULE:NAME, e.g. calculator=my_pkg.verifiers:Strict",
            field="--verifier",
        )
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise UserInputError(f"--verifier {text!r}: cannot load {path}: {exc}", field="--verifier") from None
    verifier = found() if isinstance(found, type) else found
    if not isinstance(verifier, Verifier):
        raise UserInputError(
            f"--verifier {text!r}: {path} is not a reprorl Verifier (subclass reprorl.Verifier)",
            field="--verifier",
        )
    return family, verifier


def audit_rewards(
    families: list[str] | None = typer.Argument(
        None, metavar="[ENV]...", help="Env families to audit (default: every built-in family)."
    ),
    tasks: int = typer.Option(
        8, "--tasks", min=1, help="Tasks per family (each also as its impossible variant)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the audited tasks."),
    verifier: list[str] | None = typer.Option(
        None,
        "--verifier",
        metavar="FAMILY=MODULE:NAME",
        help="Audit this verifier in place of the family's own (repeatable).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run every exploit probe (and the family's oracle, as the control) against each verifier.

    A verifier passes only if no probe earns outcome credit on the family's tasks or on their
    impossible variants, and the oracle solves every task.
    """
    from reprorl.rollout.families import FAMILIES
    from reprorl.rollout.reward_audit import ORACLE, TASKS
    from reprorl.rollout.reward_audit import audit_rewards as run_audit

    chosen = dict(FAMILIES)
    for item in verifier or []:
        family, replacement = load_verifier(item)
        if family not in chosen:
            raise UserInputError(
                f"--verifier {item!r}: no env family {family!r}; families: {', '.join(sorted(chosen))}",
                field="--verifier",
            )
        chosen[family] = dataclasses.replace(chosen[family], verifier=replacement)
    for name in families or []:
        if name not in chosen:
            raise UserInputError(
                f"no env family {name!r}; families: {', '.join(sorted(chosen))}", field="ENV"
            )
    audits = asyncio.run(run_audit(chosen, names=families or None, tasks=tasks, seed=seed))
    if as_json:
        print_json({"passed": all(a.passed for a in audits), "verifiers": [a.to_json() for a in audits]})
    else:
        for audit in audits:
            table = Table(title=f"{audit.family}: {audit.verifier} ({audit.verifier_version[:12]})")
            table.add_column("probe")
            table.add_column("on tasks", justify="right")
            table.add_column("on impossible variants", justify="right")
            probes = list(dict.fromkeys(c.probe for c in audit.cells))
            for probe in probes:
                row = []
                for variant in (TASKS, "impossible"):
                    cell = audit.cell(probe, variant)
                    good = (
                        cell.hits == cell.episodes if (probe, variant) == (ORACLE, TASKS) else not cell.hits
                    )
                    text = f"{cell.hits}/{cell.episodes}" + (
                        f" ({cell.errors} unscored)" if cell.errors else ""
                    )
                    row.append(Text(text, style="green" if good and not cell.errors else "bold red"))
                table.add_row(f"{probe} (control: solves)" if probe == ORACLE else probe, *row)
            console.print(table)
            if audit.passed:
                console.print(Text(f"PASS  {audit.family}: {audit.verifier}", style="bold green"))
            for failure in audit.failures:
                console.print(Text(f"FAIL  {audit.family}: {audit.verifier} — {failure}", style="bold red"))
        failed = [f"{a.family} ({a.verifier})" for a in audits if not a.passed]
        console.print(
            f"{len(audits) - len(failed)}/{len(audits)} verifiers pass"
            + (f"; failing: {', '.join(failed)}" if failed else "")
        )
    if not all(a.passed for a in audits):
        raise typer.Exit(EXIT_FAILED)
