"""`reprorl rewards audit`: every exploit probe against each env family's verifier, as a table.

With `--judge FILE.toml` it audits that LLM judge instead of the verifiers: the probes' episodes
and trivial answers are judged, the audit is recorded as a `judge-audit` artifact, and the judge
is refused when more than `--judge-threshold` of those judgements pass.

Exit codes: 0 when every verifier passes (or the judge is not refused), 1 when any fails (the
table or JSON is printed either way), 2 for an error such as an unknown family, a verifier that
cannot be loaded or a bad judge file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table
from rich.text import Text

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.config.load import load_judge_config
from reprorl.errors import UserInputError
from reprorl.rewards.base import Verifier

if TYPE_CHECKING:
    from reprorl.config.judge import JudgeConfig
    from reprorl.orchestrate.jobs.judge_audit import JudgeAudit
    from reprorl.rollout.families import Family

EXIT_FAILED = 1


def load_verifier(text: str) -> tuple[str, Verifier]:
    """`FAMILY=NAME` (a registered verifier) or `FAMILY=MODULE:NAME` (a Verifier instance or a class
    to build) to (family, verifier)."""
    from reprorl.rewards.registered import VERIFIERS

    family, _, path = text.partition("=")
    module_name, _, name = path.partition(":")
    if family and module_name and not name:
        if module_name not in VERIFIERS:
            known = ", ".join(VERIFIERS.names())
            raise UserInputError(
                f"--verifier {text!r}: no verifier {module_name!r}; verifiers: {known}", field="--verifier"
            )
        return family, VERIFIERS[module_name]()
    if not family or not module_name or not name:
        raise UserInputError(
            f"--verifier {text!r}: write FAMILY=NAME (a registered verifier, e.g. calculator=expression) "
            "or FAMILY=MODULE:NAME, e.g. calculator=my_pkg.verifiers:Strict",
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


def reward_weights(items: Sequence[str]) -> dict[str, float] | None:
    """`--weight COMPONENT=WEIGHT` items as a run's reward weights, checked as a spec checks them."""
    from reprorl.config.data import check_reward_weights

    if not items:
        return None
    weights: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            raise UserInputError(
                f"{item!r}: write COMPONENT=WEIGHT, e.g. failed_calls=-0.1", field="--weight"
            ) from None
        if not name.strip():
            raise UserInputError(f"{item!r}: name the component, e.g. outcome=1", field="--weight")
    try:
        check_reward_weights(weights)
    except ValueError as exc:
        raise UserInputError(str(exc), field="--weight") from None
    return weights


def audit_rewards(
    ctx: typer.Context,
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
        help="Audit this verifier in place of the family's own: FAMILY=NAME (registered) or "
        "FAMILY=MODULE:NAME (repeatable).",
    ),
    weight: list[str] | None = typer.Option(
        None,
        "--weight",
        metavar="COMPONENT=WEIGHT",
        help="Total rewards with these weights, as a run's data.reward_weights would (repeatable; "
        "default outcome=1): a probe fails the verifier if its total is above 0.",
    ),
    judge: Path | None = typer.Option(
        None,
        "--judge",
        metavar="FILE.toml",
        help="Audit this LLM judge (a TOML file of JudgeConfig fields) instead of the verifiers.",
    ),
    judge_threshold: float = typer.Option(
        0.05,
        "--judge-threshold",
        help="Refuse the judge when more than this share of attack judgements pass.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run every exploit probe (and the family's oracle, as the control) against each verifier.

    A verifier passes only if no probe earns reward (outcome credit, or a total above 0 under the
    --weight shaping) on the family's tasks or on their impossible variants, and the oracle solves
    every task. With --judge, the judge is audited
    instead and refused when the share of attacks it passes exceeds --judge-threshold.
    """
    from reprorl.rollout.families import FAMILIES
    from reprorl.rollout.reward_audit import ORACLE, TASKS
    from reprorl.rollout.reward_audit import audit_rewards as run_audit

    if judge is not None and verifier:
        raise UserInputError("audits a judge; --verifier audits a verifier: give one", field="--judge")
    if not 0.0 <= judge_threshold < 1.0:
        raise UserInputError(f"must be in [0, 1), got {judge_threshold}", field="--judge-threshold")
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
    if judge is not None:
        _audit_judge(ctx, load_judge_config(judge), chosen, families, tasks, seed, judge_threshold, as_json)
        return
    weights = reward_weights(weight or [])
    audits = asyncio.run(run_audit(chosen, names=families or None, tasks=tasks, seed=seed, weights=weights))
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


def _audit_judge(
    ctx: typer.Context,
    config: JudgeConfig,
    chosen: dict[str, Family],
    names: list[str] | None,
    tasks: int,
    seed: int,
    threshold: float,
    as_json: bool,
) -> None:
    from reprorl.evaluation.judge import make_judge
    from reprorl.orchestrate.jobs.judge_audit import audit_judge, record_judge_audit

    store = options(ctx).store()
    with make_judge(config, store.root / "cache" / "judge") as judge:
        audit = asyncio.run(
            audit_judge(judge, chosen, names=names or None, tasks=tasks, seed=seed, threshold=threshold)
        )
    version = record_judge_audit(store, audit)
    if as_json:
        print_json({**audit.to_json(), "artifact": version.label})
    else:
        _print_judge_audit(audit)
        console.print(f"recorded as {version.label}")
    if audit.refused:
        raise typer.Exit(EXIT_FAILED)


def _print_judge_audit(audit: JudgeAudit) -> None:
    table = Table(title=f"judge {audit.judge} on {', '.join(audit.families)} ({audit.tasks} tasks each)")
    for column in ("attack", "kind", "fooled/n", "rate [95% CI]", "no score"):
        table.add_column(column, justify="left" if column in ("attack", "kind") else "right")
    for cell in (*audit.attacks, audit.control):
        rate = cell.rate
        shown = "-" if rate is None else f"{rate.value:.1%} [{rate.low:.1%}, {rate.high:.1%}]"
        control = cell is audit.control
        good = cell.passed == cell.judged if control else not cell.passed
        name = f"{cell.attack} (control: passes)" if control else cell.attack
        counts = Text(f"{cell.passed}/{cell.judged}", style="green" if good else "bold red")
        table.add_row(name, cell.kind, counts, shown, str(cell.failed) if cell.failed else "")
    console.print(table)
    for warning in audit.warnings:
        console.print(Text(f"WARN  {warning}", style="yellow"))
    if audit.refused:
        console.print(Text(f"REFUSED  {audit.judge} — {audit.reason}", style="bold red"))
    else:
        console.print(Text(f"PASS  {audit.judge} — {audit.reason}", style="bold green"))
