"""The judge's gate: a judge whose robustness audit refused it (or that was never audited) gives no reward.

Audits are stored as versions of the `judge-audit` artifact, found by judge id; a run, and a
scoring job, look up the newest one here before a judge's scores may count.
"""

from __future__ import annotations

from typing import Any

from reprorl.errors import UserInputError
from reprorl.store import ArtifactVersion, Store

ARTIFACT, KIND = "judge-audit", "judge_audit"
OVERRIDE_EVENT, ROBUST_EVENT = "judge_override", "judge_robust"


def newest_audit(store: Store, judge_id: str) -> ArtifactVersion | None:
    """The newest recorded audit of `judge_id`, or None when it was never audited."""
    if not store.has_registry():
        return None
    found = [
        v for v in store.registry.versions(ARTIFACT) if v.kind == KIND and v.meta.get("judge") == judge_id
    ]
    return found[-1] if found else None


def require_robust_judge(
    store: Store, judge_id: str, *, override: str | None = None, override_hint: str = "override='<reason>'"
) -> dict[str, Any]:
    """The gate a judge must pass before its scores may become a reward.

    A training run with `data.judge` passes it before its record is written
    (`reprorl.orchestrate.run.judge_reward.check_judge`). It finds the newest `judge-audit` of
    `judge_id` and raises `UserInputError` when there is none or it refused the judge, unless
    `override` gives a reason (`override_hint` says where to give it).
    It returns the fields of an event for the caller's run record: `event` is `judge_robust`, or
    `judge_override` (with the reason) when the override was needed, e.g.
    `run.event(fields["event"], **fields)`.
    """
    version = newest_audit(store, judge_id)
    rate = None if version is None else version.meta.get("fooled_rate")
    fields: dict[str, Any] = {
        "event": ROBUST_EVENT,
        "judge": judge_id,
        "audit": None if version is None else version.label,
        "audit_hash": None if version is None else version.hash,
        "fooled_rate": rate,
        "threshold": None if version is None else version.meta.get("threshold"),
    }
    if version is not None and not version.meta.get("refused"):
        return fields
    if version is None:
        problem = f"judge {judge_id} has no robustness audit"
        fix = "run 'reprorl rewards audit --judge FILE.toml'"
    else:
        shown = "no score" if rate is None else f"{rate:.1%}"
        problem = f"judge {judge_id} was refused by its audit {version.label} (fooled rate {shown})"
        fix = "fix the rubric or the model and audit it again"
    if override is None or not override.strip():
        raise UserInputError(f"{problem}; {fix}, or give {override_hint} to use it anyway")
    return {**fields, "event": OVERRIDE_EVENT, "reason": override.strip()}
