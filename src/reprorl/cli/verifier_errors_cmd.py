"""`reprorl rewards errors`: each scorer's false-positive and false-negative rates against human labels."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.table import Table

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.store import find_run

if TYPE_CHECKING:
    from reprorl.evaluation.stats import Estimate
    from reprorl.evaluation.verifier_errors import ScorerErrors, VerifierErrors

SHOWN_FLAGGED = 5
SHOWN_VERSION = 19  # "sha256:" and 12 hex: enough to tell versions apart in a table


def verifier_errors(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="Run id or a unique prefix of it."),
    reviewer: str | None = typer.Option(
        None, "--reviewer", help="Only this reviewer's labels (default: each rollout's newest label)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON, with every flagged rollout id."),
) -> None:
    """How often the verifier, cross-verifiers and judges pass what humans failed (and the reverse)."""
    from reprorl.evaluation.verifier_errors import verifier_errors as measure

    record = find_run(options(ctx).store(), run)
    result = measure(record, reviewer.strip() if reviewer else None)
    if as_json:
        print_json(result.to_json())
        return
    if not result.scorers:
        console.print(f"run {record.run_id} has no scored rollouts: nothing to compare", markup=False)
        return
    _print_errors(result)
    _print_disagreements(result)


def _print_errors(result: VerifierErrors) -> None:
    if not result.labelled:
        by = f" by {result.reviewer}" if result.reviewer else ""
        console.print(
            f"no human labels{by} on the {result.rollouts} scored rollouts of run {result.run_id}: "
            "error rates need them (label with `reprorl rewards review RUN`)",
            markup=False,
        )
        return
    who = result.reviewer or "newest label per rollout"
    table = Table(title=f"against human labels ({who}; {result.labelled} of {result.rollouts} labelled)")
    for name in ("scorer", "labelled", "FP", "FN", "FP rate [95% CI]", "FN rate [95% CI]", "precision"):
        table.add_column(name)
    for scorer in result.scorers:
        table.add_row(
            _name(scorer),
            str(scorer.n),
            str(scorer.fp),
            str(scorer.fn),
            _rate(scorer.fp_rate),
            _rate(scorer.fn_rate),
            _rate(scorer.precision),
        )
    console.print(table)
    console.print("FP: the scorer passed what a human failed; FN: the reverse. Intervals: Wilson 95%.")


def _print_disagreements(result: VerifierErrors) -> None:
    if not result.disagreements:
        console.print("no second verifier or judge to compare the verifier with", markup=False)
        return
    table = Table(title="disagreement with the verifier (no labels needed)")
    for name in ("scorer", "both scored", "disagree", "rate [95% CI]", "flagged for review"):
        table.add_column(name)
    for pair in result.disagreements:
        # Every id starts with the run's: the rest is what tells them apart on screen.
        flagged = [r.removeprefix(f"{result.run_id}/") for r in pair.flagged]
        shown = ", ".join(flagged[:SHOWN_FLAGGED])
        if len(flagged) > SHOWN_FLAGGED:
            shown += f", … (+{len(flagged) - SHOWN_FLAGGED}; all with --json)"
        table.add_row(pair.b, str(pair.n), str(len(flagged)), _rate(pair.rate), shown or "-")
    console.print(table)


def _name(scorer: ScorerErrors) -> str:
    if not scorer.versions:
        return scorer.scorer
    return f"{scorer.scorer} ({', '.join(v[:SHOWN_VERSION] for v in scorer.versions)})"


def _rate(estimate: Estimate | None) -> str:
    return "-" if estimate is None else f"{estimate.value:.3f} [{estimate.low:.2f}, {estimate.high:.2f}]"
