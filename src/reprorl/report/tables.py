"""Report tables: eval points per suite with their intervals, judge against human labels, guard events."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from reprorl.errors import ReprorlError
from reprorl.evaluation.labels import agreement, latest_labels
from reprorl.report.page import Section, esc, no_data, none_line, note, table
from reprorl.report.records import RunView
from reprorl.report.series import eval_points, finite

DASH = "\u2013"  # shown for a figure that was not logged
GUARD_EVENTS = ("guard_check", "reverted", "stopped_by_rule")


def number(value: Any, digits: int = 3) -> str:
    found = finite(value)
    return DASH if found is None else f"{found:.{digits}f}"


def with_interval(line: Mapping[str, Any], key: str) -> str:
    """`value [low, high]`, or the value alone where no interval was logged."""
    value, low, high = (finite(line.get(k)) for k in (key, f"{key}_low", f"{key}_high"))
    if value is None:
        return DASH
    if low is None or high is None:
        return f"{value:.3f}"
    return f"{value:.3f} [{low:.3f}, {high:.3f}]"


def evals(view: RunView) -> Section:
    """Every eval point per suite, with its intervals, then the judge against the human labels."""
    parts: list[str] = []
    suites = eval_points(view.eval_lines())
    if not suites:
        parts.append(none_line("No eval points were recorded."))
    for suite, lines in suites.items():
        parts.append(f"<h3>{esc(suite)}</h3>")
        rows = []
        for m in lines:
            k = f"eval/{suite}"
            rows.append(
                [
                    esc(m["step"]),
                    esc(with_interval(m, f"{k}/success")),
                    esc(with_interval(m, f"{k}/partial_credit")),
                    esc(number(m.get(f"{k}/reward"))),
                    esc(number(m.get(f"{k}/tasks"), 0)),
                    esc(number(m.get(f"{k}/rollouts"), 0)),
                    esc(number(m.get(f"{k}/invalid_calls_mean"))),
                    esc(number(m.get(f"{k}/unsafe_actions"), 0)),
                    esc(number(m.get(f"{k}/cost_usd"), 6)),
                    f"<code>{esc(_short(m.get('policy_version')))}</code>",
                ]
            )
        parts.append(
            table(
                [
                    "step",
                    "success [95% CI]",
                    "partial credit [95% CI]",
                    "reward",
                    "tasks",
                    "rollouts",
                    "invalid calls / episode",
                    "unsafe actions",
                    "cost (USD)",
                    "policy version",
                ],
                rows,
                numeric=range(1, 9),
            )
        )
    parts.append("<h3>Judge against human labels</h3>")
    parts.extend(judge_vs_human(view))
    return Section("eval", "Eval points", tuple(parts), has_data=bool(suites))


def judge_vs_human(view: RunView) -> list[str]:
    """Agreement (raw and Cohen's kappa) of each judge with the humans, or one line saying why none."""
    errors = [e for e in (view.labels_error, view.scores_error) if e]
    if errors:
        return [f'<p class="bad">{esc(e)}</p>' for e in errors]
    scored = [s for s in view.scores if s.score is not None]
    if not view.labels and not scored:
        return [none_line("No human labels and no judge scores are stored for this run.")]
    if not view.labels or not scored:
        have = f"{len(view.labels)} human labels" if view.labels else f"{len(scored)} judge scores"
        lack = "no judge scores" if view.labels else "no human labels"
        return [none_line(f"{have} but {lack}: nothing to compare.")]
    rows = []
    for judge in sorted({s.judge for s in scored}):
        try:
            found = agreement(view.scores, view.labels, judge=judge)
        except ReprorlError as exc:
            return [f'<p class="bad">{esc(exc)}</p>']
        rows.append(
            [
                f"<code>{esc(judge)}</code>",
                esc(found.n),
                esc(DASH if found.percent is None else f"{found.percent:.1f}%"),
                esc("undefined" if found.kappa is None else f"{found.kappa:.3f}"),
                esc(found.both_pass),
                esc(found.both_fail),
                esc(found.judge_only_pass),
                esc(found.human_only_pass),
            ]
        )
    headers = [
        "judge",
        "rollouts both scored",
        "agreement",
        "Cohen's kappa",
        "both pass",
        "both fail",
        "judge only pass",
        "human only pass",
    ]
    reviewers = sorted({label.reviewer for label in view.labels})
    return [
        table(headers, rows, numeric=range(1, 8)),
        note(
            f"{len(latest_labels(view.labels))} labelled rollouts by {', '.join(reviewers)}; pass means a "
            "score of at least 0.5, and each rollout's newest label counts."
        ),
    ]


def _short(value: Any) -> str:
    text = str(value or "")
    return text if len(text) <= 32 else text[:32] + "…"


def _names(value: Any) -> str:
    return ", ".join(str(v) for v in value) if isinstance(value, list) else ""


def _json(value: Any) -> str:
    return f"<pre>{esc(json.dumps(value, indent=1, sort_keys=True, default=str))}</pre>"


def guards(view: RunView) -> Section:
    """The rollback rules' checks, reverts and stops, each with the evidence it was taken on."""
    found = view.events_named(*GUARD_EVENTS)
    if not found:
        rules = ((view.spec or {}).get("evaluation") or {}).get("rollback") or []
        why = "no rollback rules were set" if not rules else "no eval point was checked"
        return no_data("guards", "Guard events", f"No guard events: {why}.")
    rows = []
    for e in found:
        kind = str(e.get("event"))
        listed = e.get("fired")
        fired: list[Any] = listed if isinstance(listed, list) else []
        if kind == "guard_check":
            outcome = "passed" if e.get("passed") else f"failed → {e.get('action')}"
            css = "good" if e.get("passed") else "bad"
            rules = ", ".join(str(f.get("when")) for f in fired if isinstance(f, dict)) or "none fired"
            evidence = "".join(
                f"<p>{esc(f.get('when'))}: {esc(f.get('message', ''))}</p>{_json(f.get('evidence'))}"
                for f in fired
                if isinstance(f, dict)
            )
        elif kind == "reverted":
            outcome, css = f"reverted to the weights of step {e.get('to_step')}", "bad"
            rules = _names(e.get("rules"))
            evidence = f"<code>{esc(e.get('policy_version', ''))}</code>"
        else:
            outcome, css = f"stopped ({e.get('action')})", "bad"
            rules = _names(e.get("rules"))
            evidence = ""
        rows.append(
            [
                esc(e.get("step", "")),
                esc(kind),
                f'<span class="{css}">{esc(outcome)}</span>',
                esc(rules),
                evidence or DASH,
            ]
        )
    return Section(
        "guards", "Guard events", (table(["step", "event", "outcome", "rules", "evidence"], rows),)
    )
