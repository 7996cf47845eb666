"""The rules that end a run early besides the rollback rules: a budget spent, a share of rollouts unscored.

Each check records its `stopped_by_rule` event and returns why the run stops (None: it goes on).
"""

from __future__ import annotations

from collections.abc import Sequence

from reprorl.config import RunSpec
from reprorl.orchestrate.run.budget import BudgetMeter
from reprorl.rollout.scoring import EXCLUDED, exclusion_metrics
from reprorl.store import RunRecord
from reprorl.types import Trajectory


def budget_stop(budget: BudgetMeter, record: RunRecord, step: int) -> str | None:
    """Stop once one of `budget`'s caps is spent (checked before each step and eval)."""
    reached = budget.reached()
    if reached is None:
        return None
    field, why = reached
    record.event("stopped_by_rule", step=step, rules=[field], action="stop", spent=budget.figures())
    return f"{why} (before step {step})"


def unscored_stop(
    spec: RunSpec, record: RunRecord, step: int, trajectories: Sequence[Trajectory], where: str
) -> str | None:
    """Stop when more of these rollouts went unscored than `evaluation.max_unscored_share` allows:
    what is left is no fair sample of the policy (the verifier may fail on one kind of answer only),
    so it is neither trained on nor taken as a measurement."""
    limit = spec.evaluation.max_unscored_share
    figures = exclusion_metrics(trajectories)
    share = figures["unscored_share"]
    if limit is None or share <= limit:
        return None
    classes = {k.removeprefix(EXCLUDED): int(v) for k, v in figures.items() if k.startswith(EXCLUDED) and v}
    record.event(
        "stopped_by_rule",
        step=step,
        rules=["max_unscored_share"],
        action="stop",
        where=where,
        unscored_share=share,
        limit=limit,
        excluded=classes,
    )
    return (
        f"evaluation.max_unscored_share: {share:.0%} of the {where} rollouts of step {step} were "
        f"unscored ({', '.join(f'{k} {n}' for k, n in sorted(classes.items()))}), more than {limit:g}"
    )
