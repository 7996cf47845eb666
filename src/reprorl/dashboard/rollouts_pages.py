"""The rollout viewer: a run's rollouts as a paged, filtered table, one rollout in full, and its replay."""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from reprorl.dashboard.conversation import Decode, rollout_html
from reprorl.dashboard.filters import FAILURES, SPLITS, TERMINATIONS, RolloutFilters
from reprorl.dashboard.layout import form, link, number, page, section, select, text_input
from reprorl.dashboard.reader import RunCache
from reprorl.dashboard.runs_pages import reader_of
from reprorl.dashboard.security import refuse
from reprorl.errors import NotFoundError, ReprorlError, UserInputError
from reprorl.evaluation.judge import read_scores
from reprorl.report.page import esc, none_line, table
from reprorl.store.documents import plain_row

router = APIRouter()
TABLE_COLUMNS = (
    "step",
    "rollout_id",
    "split",
    "task_id",
    "termination",
    "reward_total",
    "n_turns",
    "n_tool_calls",
    "tool_outcomes",
    "completion_tokens",
    "wall_s",
)
_replaying = threading.Lock()


def filters_of(
    where: str = "",
    split: str = "",
    step: str = "",
    termination: str = "",
    failure: str = "",
    reward_min: str = "",
    reward_max: str = "",
    family: str = "",
    task: str = "",
    page: int = 1,
    per_page: int = 50,
) -> RolloutFilters:
    """The filters a form sent: an empty box filters nothing, a number box must hold a number."""
    return RolloutFilters(
        where,
        split,
        _number(step, "step", int),
        termination,
        failure,
        _number(reward_min, "reward_min", float),
        _number(reward_max, "reward_max", float),
        family,
        task,
        page,
        per_page,
    )


def _number(text: str, field: str, kind: type[int] | type[float]) -> Any:
    if not text.strip():
        return None
    try:
        return kind(text.strip())
    except ValueError:
        raise refuse(field, f"{text[:40]!r} is not {'an integer' if kind is int else 'a number'}") from None


def rollout_page(cache: RunCache, tasks: dict[str, Any], filters: RolloutFilters) -> dict[str, Any]:
    """One page of the filtered table, with the total that matched."""
    condition = filters.condition(tasks)
    try:
        total = cache.rollouts.count(condition)
        rows = cache.rollouts.query(
            condition,
            columns=TABLE_COLUMNS,
            limit=filters.per_page,
            offset=(filters.page - 1) * filters.per_page,
        ).to_pylist()
    except UserInputError as exc:
        raise refuse("where", str(exc).removeprefix("where: ")) from None
    return {
        "total": total,
        "page": filters.page,
        "per_page": filters.per_page,
        "where": condition,
        "rows": [plain_row(r) for r in rows],
    }


@router.get("/api/runs/{run_id}/rollouts")
def api_rollouts(
    request: Request,
    run_id: str,
    where: str = "",
    split: str = "",
    step: str = "",
    termination: str = "",
    failure: str = "",
    reward_min: str = "",
    reward_max: str = "",
    family: str = "",
    task: str = "",
    page_no: int = Query(1, alias="page"),
    per_page: int = 50,
) -> dict[str, Any]:
    reader = reader_of(request)
    cache = reader.run(run_id)
    filters = filters_of(
        where, split, step, termination, failure, reward_min, reward_max, family, task, page_no, per_page
    )
    return rollout_page(cache, cache.tasks(reader.store), filters)


@router.get("/runs/{run_id}/rollouts", response_class=HTMLResponse)
def rollouts_table(
    request: Request,
    run_id: str,
    where: str = "",
    split: str = "",
    step: str = "",
    termination: str = "",
    failure: str = "",
    reward_min: str = "",
    reward_max: str = "",
    family: str = "",
    task: str = "",
    page_no: int = Query(1, alias="page"),
    per_page: int = 50,
) -> HTMLResponse:
    reader = reader_of(request)
    cache = reader.run(run_id)
    tasks = cache.tasks(reader.store)
    filters = filters_of(
        where, split, step, termination, failure, reward_min, reward_max, family, task, page_no, per_page
    )
    families = sorted({t.family for t in tasks.values()})
    controls = form(
        f"/runs/{run_id}/rollouts",
        [
            text_input(
                "where", "SQL", where, wide=True, placeholder="e.g. reward_total = 0 AND n_tool_calls > 1"
            ),
            select("split", "split", SPLITS, split),
            text_input("step", "step", step),
            select("termination", "termination", TERMINATIONS, termination),
            select("failure", "failure", FAILURES, failure),
            text_input("reward_min", "reward ≥", reward_min),
            text_input("reward_max", "reward ≤", reward_max),
            select("family", "family", families, family),
            text_input("task", "task id", task),
        ],
    )
    result = rollout_page(cache, tasks, filters)
    body = [
        controls,
        f'<p class="note" id="rollout-count">{result["total"]} rollouts match'
        + (f": <code>{esc(result['where'])}</code>" if result["where"] else "")
        + "</p>",
    ]
    if result["rows"]:
        cells = []
        for r in result["rows"]:
            href = f"/runs/{run_id}/rollout?id={quote(r['rollout_id'], safe='')}"
            outcomes = [o for o in r["tool_outcomes"] or [] if o != "ok"]
            cells.append(
                [
                    esc(r["step"]),
                    f'<a class="rollout-link" href="{esc(href)}">{esc(r["rollout_id"])}</a>',
                    esc(r["split"]),
                    esc(r["task_id"]),
                    _termination(r["termination"]),
                    number(r["reward_total"]),
                    esc(r["n_turns"]),
                    esc(r["n_tool_calls"]),
                    esc(", ".join(outcomes)),
                    esc(r["completion_tokens"]),
                    number(r["wall_s"], 2),
                ]
            )
        headers = [
            "step",
            "rollout",
            "split",
            "task",
            "termination",
            "reward",
            "turns",
            "calls",
            "failed calls",
            "tokens",
            "wall s",
        ]
        body.append(f'<div id="rollout-table">{table(headers, cells, numeric=[5, 6, 7, 9, 10])}</div>')
        pages = max(1, -(-result["total"] // filters.per_page))
        nav = [f"page {filters.page} of {pages}"]
        if filters.page > 1:
            nav.insert(
                0, link(f"/runs/{run_id}/rollouts?{filters.query(page=filters.page - 1)}", "← previous")
            )
        if filters.page < pages:
            nav.append(link(f"/runs/{run_id}/rollouts?{filters.query(page=filters.page + 1)}", "next →"))
        body.append(f'<p class="pager">{" · ".join(nav)}</p>')
    else:
        body.append(none_line("No rollouts match."))
    title = f"Rollouts of {run_id}"
    back = f"<p>{link(f'/runs/{run_id}', '← the run')}</p>"
    return page(title, back + section("rollouts", "Rollouts", "\n".join(body)), active="runs")


def _termination(value: str) -> str:
    return f'<span class="{"good" if value == "answered" else "bad"}">{esc(value)}</span>'


def decoder_for(request: Request, cache: RunCache) -> Decode | None:
    base = (cache.spec().get("model") or {}).get("base")
    if not isinstance(base, str) or not request.app.state.decode_tokens:
        return None
    return reader_of(request).decoder(base)


@router.get("/runs/{run_id}/rollout", response_class=HTMLResponse)
def rollout_detail(request: Request, run_id: str, id: str) -> HTMLResponse:
    reader = reader_of(request)
    cache = reader.run(run_id)
    try:
        trajectory = cache.rollouts.get(id)
    except NotFoundError:
        raise refuse("id", f"no rollout {id[:200]!r} in run {run_id}", status=404) from None
    task = cache.tasks(reader.store).get(trajectory.task_hash)
    try:
        judged = [s for s in read_scores(cache.record) if s.rollout_id == id]
    except (ReprorlError, OSError):
        judged = []
    body = rollout_html(trajectory, task, judged, decoder_for(request, cache))
    replay = (
        '<section id="sec-replay"><h2>Replay</h2>'
        '<p class="note">Re-executes this rollout from its record and shows the first token that '
        "differs, if any.</p>"
        '<label>mode <select id="replay-mode">'
        '<option value="recorded">recorded (tool results from the record)</option>'
        '<option value="live">live (tools and verifier run again)</option></select></label> '
        f'<button type="button" id="replay" data-run="{esc(run_id)}" data-rollout="{esc(id)}">Replay</button>'
        '<div id="replay-result"></div></section>'
    )
    back = (
        f"<p>{link(f'/runs/{run_id}/rollouts', '← the rollouts')} · {link(f'/runs/{run_id}', 'the run')}</p>"
    )
    return page(
        f"Rollout {trajectory.task_id}", back + body + replay, active="runs", data={"page": "rollout"}
    )


@router.post("/api/runs/{run_id}/replay")
def api_replay(request: Request, run_id: str, id: str, mode: str = "recorded") -> dict[str, Any]:
    """Replay one rollout (one at a time per dashboard, on a worker thread, never the event loop
    that serves the live pages); the report names the first difference."""
    from reprorl.orchestrate.jobs.replay import Replayer, run_of

    reader = reader_of(request)
    reader.run(run_id)
    if mode not in ("recorded", "live"):
        raise refuse("mode", f"{mode[:40]!r} is not 'recorded' or 'live'")
    if run_of(id) != run_id:
        raise refuse("id", f"rollout {id[:200]!r} is not of run {run_id}")
    if not _replaying.acquire(blocking=False):
        raise refuse("replay", "another replay is running; try again when it ends", status=409)
    try:
        replayer = Replayer(reader.store)
        try:
            report = asyncio.run(replayer.replay(id, mode="live" if mode == "live" else "recorded"))
        finally:
            replayer.close()
    except NotFoundError:
        raise refuse("id", f"no rollout {id[:200]!r} in run {run_id}", status=404) from None
    except UserInputError as exc:
        raise refuse("id", str(exc)) from None
    except ReprorlError as exc:
        raise refuse("replay", str(exc), status=422) from None
    finally:
        _replaying.release()
    out = report.to_json()
    first = report.first
    out["first_difference"] = (
        None
        if first is None
        else {
            "where": first.where,
            "turn": first.turn,
            "index": first.index,
            "recorded": repr(first.recorded)[:300],
            "replayed": repr(first.replayed)[:300],
        }
    )
    return out
