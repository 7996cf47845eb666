"""One rollout as a conversation: the task, each turn's text, tokens, calls and results, and its score.

Sampled tokens are drawn as a heat map of their behaviour logprobs: each token a span whose shade
is one of ten probability buckets (a class, not a computed style), its id and logprob in its title.
Every text comes from the record or the task set and is escaped before it is placed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence

from reprorl.evaluation.judge import JudgeScore
from reprorl.report.page import esc, facts, none_line, table
from reprorl.types import Task, ToolOutcome, Trajectory, Turn

MAX_HEAT_TOKENS = 4096
Decode = Callable[[int], str]


def _pretty(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def bucket(logprob: float) -> int:
    """0 (the sampler was sure) … 9 (it was not): ten equal bands of the token's probability."""
    if not math.isfinite(logprob):
        return 9
    return min(9, int((1.0 - math.exp(min(logprob, 0.0))) * 10))


def heat_map(turn: Turn, decode: Decode | None) -> str:
    if not turn.token_ids:
        return none_line("No sampled tokens in this turn.")
    spans = []
    shown = turn.token_ids[:MAX_HEAT_TOKENS]
    for i, token in enumerate(shown):
        lp = turn.logprobs[i] if i < len(turn.logprobs) else math.nan
        text = decode(token) if decode is not None else f"[{token}]"
        title = (
            f"#{i} token {token} · logprob {lp:.4f} · p {math.exp(lp):.3f}"
            if math.isfinite(lp)
            else f"#{i} token {token}"
        )
        spans.append(f'<span class="tok b{bucket(lp)}" title="{esc(title)}">{esc(text)}</span>')
    more = len(turn.token_ids) - len(shown)
    tail = f'<p class="note">{more} more tokens not drawn.</p>' if more else ""
    legend = (
        ""
        if decode is not None
        else '<p class="note">Token ids shown: the tokenizer could not be loaded.</p>'
    )
    return f'<div class="heat" data-tokens="{len(turn.token_ids)}">{"".join(spans)}</div>{tail}{legend}'


def _messages(task: Task | None) -> str:
    if task is None:
        return none_line("The task is not in the run's pinned task sets; its prompt cannot be shown.")
    items = [
        f'<li class="message role-{esc(m.role.value)}"><b>{esc(m.role.value)}</b>'
        f"<pre>{esc(m.content)}</pre></li>"
        for m in task.prompt
    ]
    return f'<ol class="turns prompt">{"".join(items)}</ol>'


def _turn(turn: Turn, decode: Decode | None) -> str:
    calls = "".join(
        f'<div class="tool-call"><b>call {esc(c.name)}</b> <code>{esc(c.id)}</code>'
        f"<pre>{esc(_pretty(c.arguments))}</pre></div>"
        for c in turn.tool_calls
    )
    results = []
    for r in turn.tool_results:
        failed = r.outcome is not ToolOutcome.OK
        body = r.content if not r.error else f"{r.error}\n{r.content}".strip()
        extra = [f"{r.duration_s:.3f} s"]
        if r.noise:
            extra.append(f"noise: {r.noise}")
        if r.original_chars is not None:
            extra.append(f"{r.original_chars} chars before truncation")
        mark = "bad" if failed else "good"
        results.append(
            f'<div class="tool-result{" failed" if failed else ""}" data-outcome="{esc(r.outcome.value)}">'
            f'<b>result {esc(r.name)}: <span class="{mark}">{esc(r.outcome.value)}</span></b> '
            f'<span class="note">{esc(" · ".join(extra))}</span><pre>{esc(body)}</pre></div>'
        )
    meta = (
        f"finish {turn.finish_reason} · sampled {turn.sample_s:.3f} s · tools {turn.tool_s:.3f} s · "
        f"{len(turn.token_ids)} tokens · seed {turn.seed} · policy {turn.policy_version}"
    )
    return (
        f'<li class="turn" data-turn="{turn.index}"><h3>Turn {turn.index}</h3><p class="note">{esc(meta)}</p>'
        f'<pre class="model-text">{esc(turn.text)}</pre>'
        f"<details open><summary>tokens and logprobs</summary>{heat_map(turn, decode)}</details>"
        f"{calls}{''.join(results)}</li>"
    )


def _score(t: Trajectory, judged: Sequence[JudgeScore]) -> str:
    items: list[tuple[str, str]] = [("termination", esc(t.termination.value))]
    if t.error:
        items.append(("error", f"<pre>{esc(t.error)}</pre>"))
    if t.score_failure:
        items.append(("score failure", f'<span class="bad">{esc(t.score_failure.value)}</span>'))
    if t.reward is None:
        items.append(("reward", '<span class="none">unscored</span>'))
    else:
        items.append(("reward", esc(f"{t.reward.total:.4f}")))
        items.append(("verifier", f"<code>{esc(t.reward.verifier_version)}</code>"))
        rows = [[esc(k), esc(f"{v:.4f}")] for k, v in sorted(t.reward.components.items())]
        if rows:
            items.append(("components", table(["component", "value"], rows, numeric=[1])))
    if t.process_rewards:
        items.append(("process rewards", esc(", ".join(f"{r:.3f}" for r in t.process_rewards))))
    body = facts(items)
    if judged:
        rows = [
            [
                esc(j.judge),
                "—" if j.score is None else esc(f"{j.score:.3f}"),
                esc(j.failure or ""),
                f"<pre>{esc(j.rationale or j.error or '')}</pre>",
            ]
            for j in judged
        ]
        body += "<h3>Judge</h3>" + table(["judge", "score", "failure", "rationale"], rows)
    return body


def rollout_html(
    t: Trajectory, task: Task | None, judged: Sequence[JudgeScore], decode: Decode | None
) -> str:
    """The rollout's whole record, readable: facts, prompt, turns, score and the raw conditions."""
    head = facts(
        [
            ("rollout", f"<code>{esc(t.rollout_id)}</code>"),
            ("step · split · member", esc(f"{t.step} · {t.split.value} · {t.member}")),
            ("task", esc(f"{t.task_id} ({task.family})" if task else t.task_id)),
            ("policy", f"<code>{esc(t.policy_version)}</code>"),
            ("tokens", esc(f"{t.prompt_tokens} prompt · {t.completion_tokens} completion")),
            ("time", esc(f"{t.wall_s:.3f} s wall · {t.cpu_s:.3f} s CPU")),
            ("cost", esc(f"${t.cost_usd:.6f}")),
            (
                "retries",
                esc(
                    f"{t.infra_retries} infra retries" + (" · this attempt was retried" if t.retried else "")
                ),
            ),
        ]
    )
    turns = "".join(_turn(turn, decode) for turn in t.turns) or none_line(
        "No turns: the episode ended first."
    )
    conditions = {
        "sampling": t.sampling.model_dump(mode="json"),
        "sampler": t.sampler,
        "sandbox": t.sandbox,
        "env": t.env,
        "agent": t.agent,
    }
    return (
        f'<section id="sec-rollout"><h2>Rollout</h2>{head}</section>'
        f'<section id="sec-prompt"><h2>Task prompt</h2>{_messages(task)}</section>'
        f'<section id="sec-turns"><h2>Turns ({len(t.turns)})</h2><ol class="turns">{turns}</ol></section>'
        f'<section id="sec-score"><h2>Score</h2>{_score(t, judged)}</section>'
        f'<section id="sec-conditions"><h2>Conditions</h2><pre>{esc(_pretty(conditions))}</pre></section>'
    )
