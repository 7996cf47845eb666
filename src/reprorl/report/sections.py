"""Report sections over steps: the run's header, reward and success curves, health, tools and cost.

Each builder takes the run's records and returns one `Section`; a section whose records are missing
says so in one line.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from reprorl.report.charts import band_chart, cost_chart, panels_chart, stacked_chart, tool_failure_chart
from reprorl.report.page import Section, esc, facts, no_data, none_line, note
from reprorl.report.records import RunView
from reprorl.report.series import (
    eval_band,
    eval_points,
    final_train_rows,
    finite,
    health_keys,
    metric_band,
    reward_band,
    success_band,
    tool_series,
)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "(unknown)"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def _moment(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _code(info: Mapping[str, Any]) -> str:
    code = (info.get("environment") or {}).get("code") or {}
    for where in ("cwd", "reprorl"):
        state = code.get(where) if isinstance(code, dict) else None
        if isinstance(state, dict) and state.get("commit"):
            dirty = " (uncommitted changes recorded)" if state.get("dirty") else " (clean)"
            return f"<code>{esc(state['commit'])}</code>{esc(dirty)}"
    return '<span class="bad">no git commit recorded</span>'


def _total(lines: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [v for v in (finite(m.get(key)) for m in lines) if v is not None]
    return sum(values) if values else None


def _excluded(lines: Sequence[Mapping[str, Any]]) -> str:
    """The train rollouts the platform, verifier or judge failed, left out of training, by class."""
    if not any("unscored" in m for m in lines):
        return "(not counted by this run's version)"
    total = _total(lines, "unscored") or 0.0
    rollouts = _total(lines, "rollouts") or 0.0
    classes = {
        key.removeprefix("excluded/"): n
        for key in sorted({k for m in lines for k in m if k.startswith("excluded/")})
        if (n := _total(lines, key))
    }
    split = ", ".join(f"{name} {n:g}" for name, n in classes.items())
    share = f" ({total / rollouts:.0%} of {rollouts:g})" if rollouts else ""
    return f"{total:g}{share}" + (f": {split}" if split else "")


def header(view: RunView) -> Section:
    """Who and what the run was: ids and hashes, code, status, when it ran and where the time went."""
    info, status = view.info or {}, view.status or {}
    started, ended = _moment(info.get("created_at")), _moment(status.get("ended_at"))
    wall = (ended - started).total_seconds() if started and ended else None
    state = str(status.get("status", "(no status recorded)"))
    why = status.get("reason") or status.get("error")
    state_html = f'<span class="{"good" if state == "succeeded" else "bad"}">{esc(state)}</span>'
    if why:
        state_html += f" — {esc(why)}"
    base = view.inputs.get("model.base")
    spec_hash = info.get("spec_hash")
    sft = sum(float(e.get("seconds", 0.0)) for e in view.events_named("sft_done"))
    train = view.train_lines()
    rows = [
        ("run id", f"<code>{esc(view.run_id)}</code>"),
        ("name", esc(info.get("name", "(unknown)"))),
        ("status", state_html),
        ("spec hash", f"<code>{esc(spec_hash)}</code>" if spec_hash else '<span class="bad">missing</span>'),
        (
            "base model",
            f"<code>{esc(base)}</code> ({esc(view.label(base))})"
            if base
            else '<span class="bad">no base model input recorded</span>',
        ),
        ("code commit", _code(info)),
        ("started", esc(info.get("created_at", "(unknown)"))),
        ("ended", esc(status.get("ended_at") or "(not ended)")),
        ("wall time", esc(duration(wall))),
        ("SFT warm start", esc(duration(sft) if view.events_named("sft_done") else "none")),
        ("time sampling (train steps)", esc(duration(_total(train, "rollout_s")))),
        ("time updating (train steps)", esc(duration(_total(train, "train_s")))),
        ("time in eval points", esc(duration(_total(view.eval_lines(), "eval_s")))),
        ("steps logged", esc(f"{len(train)} train steps, {len(view.eval_lines())} eval lines")),
        ("rollouts left out (train steps)", esc(_excluded(train))),
    ]
    problems = [
        text
        for text in (
            view.info_error,
            view.spec_error,
            f"integrity: {view.integrity_error}" if view.integrity_error else None,
            f"metrics.jsonl lines {view.bad_metric_lines} are damaged and left out"
            if view.bad_metric_lines
            else None,
            f"events.jsonl lines {view.bad_event_lines} are damaged and left out"
            if view.bad_event_lines
            else None,
        )
        if text
    ]
    parts: list[str] = [facts(rows)]
    parts += [f'<p class="bad">{esc(p)}</p>' for p in problems]
    return Section("header", "Run", tuple(parts))


def curves(view: RunView) -> Section:
    """Train reward and success per step with 95% intervals, and eval success per suite."""
    key, title = "curves", "Reward and success"
    parts: list[Any] = []
    seed = int((view.spec or {}).get("seed", 0) or 0)
    if view.rollouts is not None and (steps := final_train_rows(view.rollouts)):
        parts.append(
            band_chart(
                "chart-reward",
                "train reward per step (mean, 95% bootstrap interval)",
                [reward_band(steps, seed)],
                "reward",
            )
        )
        parts.append(
            band_chart(
                "chart-success",
                "train success per step (outcome success, 95% Wilson interval)",
                [success_band(steps)],
                "success rate",
                unit_range=True,
            )
        )
    elif view.train_lines():
        why = view.rollouts_error or "no train rollouts are stored"
        parts.append(
            note(
                f"The rollout store cannot give per-rollout figures ({why}); "
                "the logged step means are shown without intervals."
            )
        )
        lines = view.train_lines()
        parts.append(
            band_chart(
                "chart-reward",
                "train reward per step (logged mean)",
                [metric_band(lines, "reward_mean", "train reward")],
                "reward",
            )
        )
        parts.append(
            band_chart(
                "chart-success",
                "train success per step (logged mean)",
                [metric_band(lines, "success", "train success")],
                "success rate",
                True,
            )
        )
    else:
        parts.append(none_line("No train steps were recorded (no train rollouts and no step metrics)."))
    suites = eval_points(view.eval_lines())
    bands = [b for b in (eval_band(s, lines) for s, lines in suites.items()) if not b.empty]
    if bands:
        parts.append(
            band_chart(
                "chart-eval-success",
                "eval success per suite (95% interval over tasks)",
                bands,
                "success rate",
                unit_range=True,
            )
        )
    else:
        parts.append(none_line("No eval points were recorded."))
    return Section(key, title, tuple(parts), has_data=any(not isinstance(p, str) for p in parts))


def health(view: RunView) -> Section:
    """The update's health over steps, for the keys the metric lines have."""
    lines = view.train_lines()
    panels = health_keys(lines)
    if not panels:
        return no_data("health", "Training health", "No health metrics were recorded for any train step.")
    chart = panels_chart(
        "chart-health",
        "training health per step",
        [(title, [metric_band(lines, k) for k in keys]) for title, keys in panels],
    )
    shown = ", ".join(k for _, keys in panels for k in keys)
    return Section("health", "Training health", (chart, note(f"Metric keys shown: {shown}.")))


def tool_failures(view: RunView) -> Section:
    tools = tool_series(view.train_lines())
    if tools.empty:
        return no_data("tool-failures", "Tool failures", "No tool calls were recorded in any train step.")
    return Section(
        "tool-failures",
        "Tool failures",
        (
            tool_failure_chart("chart-tool-failures", tools),
            note(
                "By tool: the loop's tools/<tool>/failure_rate (platform failures and truncated output "
                "are not counted as the agent's). By class: calls of that outcome over all calls of the "
                "step. <unparsed> holds tool calls the model wrote but that could not be parsed."
            ),
        ),
    )


def tool_usage(view: RunView) -> Section:
    tools = tool_series(view.train_lines())
    if tools.empty:
        return no_data("tool-usage", "Tool usage", "No tool calls were recorded in any train step.")
    chart = stacked_chart(
        "chart-tool-usage", "tool calls per step, by tool", tools.steps, tools.calls, "calls"
    )
    return Section("tool-usage", "Tool usage", (chart,))


def _per_step(lines: Sequence[Mapping[str, Any]], key: str) -> dict[int, float]:
    out: dict[int, float] = defaultdict(float)
    for m in lines:
        value = finite(m.get(key))
        if value is not None:
            out[int(m["step"])] += value
    return out


def _eval_cost(lines: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    out: dict[int, float] = defaultdict(float)
    for suite, points in eval_points(lines).items():
        for m in points:
            out[int(m["step"])] += finite(m.get(f"eval/{suite}/cost_usd")) or 0.0
    return out


def cost(view: RunView) -> Section:
    """Rollouts vs updates vs eval points per step: wall seconds, CPU seconds and cost."""
    train, evals = view.train_lines(), view.eval_lines()
    series = {
        "wall": {
            "sampling": _per_step(train, "rollout_s"),
            "update": _per_step(train, "train_s"),
            "eval": _per_step(evals, "eval_s"),
        },
        "cpu": {
            "sampling": _per_step(train, "rollout_cpu_s"),
            "update": _per_step(train, "train_cpu_s"),
            "eval": _per_step(evals, "eval_cpu_s"),
        },
    }
    prices = ((view.spec or {}).get("budget") or {}).get("prices") or {}
    cpu_price = finite(prices.get("cpu_usd_per_hour")) or 0.0
    money = {
        "sampling": _per_step(train, "cost_usd"),
        "update": {s: v * cpu_price / 3600.0 for s, v in series["cpu"]["update"].items()},
        "eval": _eval_cost(evals),
    }
    steps = sorted({s for group in (*series.values(), money) for values in group.values() for s in values})
    if not steps:
        return no_data("cost", "Cost", "No timing or cost was recorded for any step.")

    def dense(group: Mapping[str, Mapping[int, float]]) -> dict[str, list[float]]:
        return {name: [values.get(s, 0.0) for s in steps] for name, values in group.items() if values}

    rows = [
        ("wall-clock seconds", "s", dense(series["wall"])),
        ("CPU seconds", "CPU s", dense(series["cpu"])),
    ]
    if any(v for values in money.values() for v in values.values()):
        rows.append(("cost", "USD", dense(money)))
        priced = note(
            "Cost of sampling and eval is each rollout's recorded price; the updates are priced here as "
            f"train_cpu_s times the spec's cpu_usd_per_hour ({cpu_price:g})."
        )
    else:
        priced = note("Every recorded cost is 0: the spec's price table is empty.")
    rows = [r for r in rows if r[2]]
    return Section("cost", "Cost", (cost_chart("chart-cost", steps, rows), priced))
