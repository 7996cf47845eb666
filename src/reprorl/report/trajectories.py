"""Report trajectories: a handful of rollouts (best, worst, one per failed termination), turn by turn.

Every text shown here came from a model, a tool or a task and is escaped before it is placed in the
page; long texts are cut with the count of what was left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from reprorl.errors import ReprorlError
from reprorl.report.page import Section, esc, facts, no_data, note, table
from reprorl.report.records import RunView
from reprorl.report.series import reward_of
from reprorl.types import Termination, ToolOutcome, Trajectory, Turn

MAX_CHARS = 2000
MAX_FAILED = 4


def pick(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    """(why, row) of the rollouts to show: best and worst reward, then the first of each failed termination.

    Rows come in step, rollout id order and ties keep the first, so the pick is the same every time.
    Retried infra attempts are left out (never the agent's result).
    """
    final = [r for r in rows if not r.get("retried")]
    if not final:
        return []
    chosen: list[tuple[str, Mapping[str, Any]]] = []
    best = max(final, key=reward_of)  # max/min keep the first of equals
    worst = min(final, key=reward_of)
    chosen.append((f"best reward ({reward_of(best):.3g})", best))
    if worst["rollout_id"] != best["rollout_id"]:
        chosen.append((f"worst reward ({reward_of(worst):.3g})", worst))
    seen = {r["rollout_id"] for _, r in chosen}
    failed = failed_terminations(final)
    for termination, (_, row) in list(failed.items())[:MAX_FAILED]:
        if row["rollout_id"] in seen:
            chosen = [(f"{why}; failed: {termination}", r) if r is row else (why, r) for why, r in chosen]
        else:
            chosen.append((f"failed: {termination}", row))
            seen.add(row["rollout_id"])
    return chosen


def failed_terminations(rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, Mapping[str, Any]]]:
    """Each failed termination: how many rollouts ended so, and the first of them; most frequent first."""
    found: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for row in rows:
        termination = str(row.get("termination"))
        if termination != Termination.ANSWERED.value:
            count, first = found.get(termination, (0, row))
            found[termination] = (count + 1, first)
    return dict(sorted(found.items(), key=lambda item: (-item[1][0], item[0])))


def clip(text: str, limit: int = MAX_CHARS) -> str:
    """Escaped text, cut at `limit` characters with the count of what was cut."""
    if len(text) <= limit:
        return esc(text)
    return f"{esc(text[:limit])}<em>… ({len(text) - limit} more characters)</em>"


def _turn(turn: Turn) -> str:
    parts = [
        f"<p><strong>turn {turn.index}</strong> · finish: {esc(turn.finish_reason)} · "
        f"{len(turn.token_ids)} tokens</p>",
        f'<div class="model-text"><pre>{clip(turn.text) or "<em>(empty)</em>"}</pre></div>',
    ]
    for call in turn.tool_calls:
        arguments = json.dumps(call.arguments, sort_keys=True, ensure_ascii=False)
        parts.append(f'<div class="tool-call"><pre>call {clip(call.name)}({clip(arguments)})</pre></div>')
    for result in turn.tool_results:
        failed = result.outcome is not ToolOutcome.OK
        lines = [f"{result.name or '(unparsed)'} → {result.outcome.value}"]
        if result.noise:
            lines[0] += f" (injected noise: {result.noise})"
        if result.error:
            lines.append(f"error: {result.error}")
        if result.content:
            lines.append(result.content)
        css = "tool-result failed" if failed else "tool-result"
        parts.append(f'<div class="{css}"><pre>{clip(chr(10).join(lines))}</pre></div>')
    return f"<li>{''.join(parts)}</li>"


def _prompt(view: RunView, trajectory: Trajectory) -> str:
    task = view.task(trajectory.task_hash)
    if task is None:
        return note("The task's prompt is not in the run's stored task sets.")
    text = "\n\n".join(f"[{m.role.value}] {m.content}" for m in task.prompt)
    return f"<details><summary>task prompt</summary><pre>{clip(text)}</pre></details>"


def render(view: RunView, why: str, trajectory: Trajectory, n: int, step: int | None = None) -> str:
    """One rollout as an article: what it was, its reward and termination, then each turn."""
    reward = trajectory.reward
    components = (
        table(
            ["component", "value"],
            [[esc(k), esc(f"{v:.4g}")] for k, v in sorted(reward.components.items())],
            numeric=[1],
        )
        if reward and reward.components
        else ""
    )
    where = trajectory.step if step is None else step  # the stored step (its part's), when known
    items = [
        ("rollout", f"<code>{esc(trajectory.rollout_id)}</code>"),
        ("step · split · task", esc(f"{where} · {trajectory.split.value} · {trajectory.task_id}")),
        ("termination", esc(trajectory.termination.value)),
        ("reward", esc("none (not scored)" if reward is None else f"{reward.total:.4g}")),
        ("tokens", esc(f"{trajectory.prompt_tokens} prompt, {trajectory.completion_tokens} completion")),
    ]
    if trajectory.error:
        items.append(("error", f'<span class="bad">{clip(trajectory.error)}</span>'))
    turns = "".join(_turn(t) for t in trajectory.turns) or "<li><em>no model turn</em></li>"
    return (
        f'<article class="trajectory" id="trajectory-{n}">'
        f"<h3>{esc(why)}</h3>{facts(items)}{components}{_prompt(view, trajectory)}"
        f'<ol class="turns">{turns}</ol></article>'
    )


def samples(view: RunView) -> Section:
    key, title = "trajectories", "Sample trajectories"
    if view.rollouts is None:
        return no_data(key, title, f"The rollout store cannot be read: {view.rollouts_error}")
    chosen = pick(view.rollouts)
    if not chosen:
        return no_data(key, title, "No rollouts are stored for this run.")
    parts: list[str] = []
    failed = failed_terminations([r for r in view.rollouts if not r.get("retried")])
    if not failed:
        parts.append(note("Every stored rollout ended answered: there is no failed termination to show."))
    elif len(failed) > MAX_FAILED:
        rest = ", ".join(f"{t} ({n})" for t, (n, _) in list(failed.items())[MAX_FAILED:])
        parts.append(note(f"Also failed, not shown here: {rest}."))
    for n, (why, row) in enumerate(chosen):
        try:
            trajectory = view.trajectory(str(row["rollout_id"]))
        except (ReprorlError, OSError) as exc:
            parts.append(f'<p class="bad">{esc(row["rollout_id"])}: {esc(exc)}</p>')
            continue
        step = row.get("step")
        parts.append(render(view, why, trajectory, n, step if isinstance(step, int) else None))
    return Section(key, title, tuple(parts))
