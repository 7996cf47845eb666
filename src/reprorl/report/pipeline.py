"""The report's sampling-ahead section: how an asynchronous run's steps were fed, step by step.

For each step: how stale its batch was, how long the trainer waited for it and the share of its time
it was updating, the queue behind it, and under arrival order which groups it took (by planned step
and version), so a reader sees where the trainer waited and which groups ran ahead of or behind
their plan. A synchronous run says it had nothing sampled ahead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reprorl.report.page import Section, esc, facts, no_data, note, table
from reprorl.report.records import RunView
from reprorl.report.series import finite
from reprorl.report.tables import DASH, number

KEY, TITLE = "pipeline", "Sampling ahead"


def _learning(view: RunView) -> Mapping[str, Any]:
    learning = (view.spec or {}).get("learning")
    return learning if isinstance(learning, dict) else {}


def _pipeline(learning: Mapping[str, Any]) -> Mapping[str, Any]:
    """`learning.pipeline`, or the same settings as an older record holds them, flat in `learning`."""
    table = learning.get("pipeline")
    if isinstance(table, dict):
        return table
    old = {"max_staleness": "max_staleness", "assembly": "source", "rollout_workers": "workers"}
    out = {new: learning[key] for key, new in old.items() if key in learning}
    if "lockstep" in learning:
        out["lockstep"] = "ready" if learning["lockstep"] == "arrival" else learning["lockstep"]
    return out


def _groups(groups: Sequence[Mapping[str, Any]], step: int) -> str:
    """`g<index> (planned p, v<version>)` per group; ahead of or behind its plan marked."""
    shown = []
    for g in groups:
        planned, mark = g.get("planned_step"), ""
        if isinstance(planned, int) and planned != step:
            mark = " ahead" if planned > step else " behind"
        restored = ", read back" if g.get("restored") else ""
        shown.append(f"g{g.get('group')} (planned {planned}{mark}, v{g.get('version')}{restored})")
    return "; ".join(shown)


def pipeline(view: RunView) -> Section:
    learning = _learning(view)
    settings = _pipeline(learning)
    lines = [m for m in view.train_lines() if "staleness_max" in m]
    if not settings.get("max_staleness"):
        return no_data(
            KEY, TITLE, "The run was synchronous: every step trained on the batch it had just sampled."
        )
    assembly = settings.get("source", "planned")
    started = view.events_named("rollout_workers")  # what the run started, over what the spec asked
    last = started[-1] if started else {}
    workers = f"{last.get('workers', settings.get('workers', 1))} ({last.get('backend', DASH)})"
    parts: list[str] = [
        facts(
            [
                ("max staleness", esc(settings.get("max_staleness", DASH))),
                ("batches", esc(assembly)),
                ("lockstep", esc(settings.get("lockstep", "batch"))),
                ("correction", esc(learning.get("correction", DASH))),
                ("rollout workers", esc(workers)),
            ]
        )
    ]
    assembled = {e.get("step"): e.get("groups") or [] for e in view.events_named("batch_assembled")}
    rows = []
    for m in lines:
        step = m["step"]
        busy = finite(m.get("timing/trainer_busy"))
        row = [
            esc(step),
            esc(f"{number(m.get('staleness_mean'), 2)} / {number(m.get('staleness_max'), 0)}"),
            esc(number(m.get("timing/wait_s"), 1)),
            esc(number(m.get("train_s"), 1)),
            esc(DASH if busy is None else f"{busy:.0%}"),
            esc(number(m.get("timing/queue_depth"), 0)),
        ]
        if assembly == "arrival":
            row.append(esc(_groups(assembled.get(step, []), step)))
        rows.append(row)
    headers = ["step", "staleness mean / max", "waited s", "update s", "trainer busy", "queued"]
    if assembly == "arrival":
        headers.append("groups trained (planned step, version)")
    parts.append(table(headers, rows, numeric=(0, 2, 3, 4, 5)))
    waited = sum(finite(m.get("timing/wait_s")) or 0.0 for m in lines)
    updating = sum(finite(m.get("train_s")) or 0.0 for m in lines)
    parts.append(
        note(
            f"The trainer waited {waited:.1f} s for batches and updated for {updating:.1f} s over "
            f"{len(lines)} steps. Waits, update times, busy shares and queue depths are wall-clock "
            "figures: they depend on the machine, not on the run's conditions."
        )
    )
    if assembly == "arrival":
        parts.append(
            note(
                "Arrival order: each step took the first groups to finish, earliest staleness deadline "
                "first, so which groups it trained depended on timing; the record holds every choice, "
                "and `reprorl reproduce` follows them."
            )
        )
    return Section(KEY, TITLE, tuple(parts))
