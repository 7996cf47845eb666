"""`reprorl rewards review`: human pass/fail labels on rollouts, given at the terminal or from a file."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import typer
from pydantic import ValidationError

from reprorl.cli.context import options
from reprorl.cli.output import console
from reprorl.errors import ReprorlError, UserInputError
from reprorl.store import RunRecord, Store, find_run
from reprorl.types import Split, Task, Trajectory

if TYPE_CHECKING:
    from reprorl.evaluation.labels import Label

MAX_SHOWN = 600
ASK = "p pass · f fail · 0-1 score · s skip · q quit (add a note after p/f/score)"


def review(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="Run id or a unique prefix of it."),
    import_file: Path | None = typer.Option(
        None,
        "--import",
        help="Import labels from a .csv (header: rollout_id,label[,reviewer,note,time]) or .jsonl file.",
    ),
    reviewer: str | None = typer.Option(
        None, "--reviewer", help="Who is reviewing (required at the terminal; the default for an import)."
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Review at most this many rollouts."),
    split: str | None = typer.Option(
        None, "--split", help="Only rollouts of this split: train, eval, holdout."
    ),
    flagged: bool = typer.Option(
        False,
        "--flagged",
        help="Only rollouts the verifier and a cross-verifier or judge disagree on (see `rewards errors`).",
    ),
) -> None:
    """Label rollouts pass/fail turn by turn, or import labels; stored apart from judge scores."""
    store = options(ctx).store()
    record = find_run(store, run)
    if import_file is not None:
        if limit is not None or split is not None or flagged:
            raise UserInputError(
                "--limit, --split and --flagged choose rollouts to review at the terminal; drop them"
            )
        from reprorl.evaluation.labels import import_labels, labels_path

        imported = import_labels(record, import_file, reviewer=reviewer)
        console.print(
            f"imported {len(imported)} label{'s' if len(imported) != 1 else ''} into {labels_path(record)}"
        )
    else:
        if reviewer is None or not reviewer.strip():
            raise UserInputError("name who is reviewing, e.g. --reviewer alice", field="--reviewer")
        _review(store, record, reviewer.strip(), limit, _split(split), _flags(record) if flagged else None)
    _print_agreement(record, reviewer)


def _split(value: str | None) -> Split | None:
    if value is None:
        return None
    try:
        return Split(value.strip().lower())
    except ValueError:
        choices = ", ".join(s.value for s in Split)
        raise UserInputError(f"{value!r} is not a split; use one of {choices}", field="--split") from None


def _flags(record: RunRecord) -> dict[str, list[str]]:
    """Why each rollout the scorers disagree on is flagged, e.g. 'verifier passed, cross/sql failed'."""
    from reprorl.evaluation.verifier_errors import verifier_errors

    reasons: dict[str, list[str]] = {}
    for pair in verifier_errors(record, None).disagreements:
        for rollout_id in pair.a_only_pass:
            reasons.setdefault(rollout_id, []).append(f"{pair.a} passed, {pair.b} failed")
        for rollout_id in pair.b_only_pass:
            reasons.setdefault(rollout_id, []).append(f"{pair.b} passed, {pair.a} failed")
    return reasons


def _review(
    store: Store,
    record: RunRecord,
    reviewer: str,
    limit: int | None,
    split: Split | None,
    flags: dict[str, list[str]] | None,
) -> None:
    from reprorl.evaluation.labels import append_label, labels_path, read_labels, reviewed_by
    from reprorl.store.rollout_query import RolloutStore

    done = reviewed_by(read_labels(record), reviewer)
    # Retried attempts were infra failures, never the agent's result: nothing to judge in them.
    where = "NOT retried" + (f" AND split = '{split.value}'" if split else "")
    trajectories = RolloutStore(record).trajectories(where)
    if flags is not None:
        trajectories = (t for t in trajectories if t.rollout_id in flags)
    pending = _pending(trajectories, done, limit)
    if not pending:
        which = "flagged " if flags is not None else ""
        console.print(
            f"nothing to review: {reviewer} has labelled every matching {which}rollout of {record.run_id}"
        )
        return
    tasks = _TaskLookup(store, record)
    tally = {"pass": 0, "fail": 0, "score": 0, "skip": 0}
    for number, trajectory in enumerate(pending, start=1):
        console.print(f"\n[bold]rollout {number}/{len(pending)}[/bold]")
        if flags is not None:
            console.print(f"flagged: {'; '.join(flags[trajectory.rollout_id])}", markup=False)
        answer = _show_and_ask(trajectory, tasks.prompt(trajectory))
        if answer.action == "quit":
            break
        if answer.action == "skip":
            tally["skip"] += 1
            continue
        label = _label(record.run_id, trajectory.rollout_id, answer.value, reviewer, answer.note)
        append_label(record, label)
        tally["score" if isinstance(label.label, float) else label.label] += 1
        console.print(f"saved: {label.label}" + (f" ({label.note})" if label.note else ""), markup=False)
    saved = tally["pass"] + tally["fail"] + tally["score"]
    console.print(
        f"\nlabelled {saved} ({tally['pass']} pass, {tally['fail']} fail, {tally['score']} scored), "
        f"skipped {tally['skip']}; labels in {labels_path(record)}"
    )


def _pending(trajectories: Iterator[Trajectory], done: set[str], limit: int | None) -> list[Trajectory]:
    pending: list[Trajectory] = []
    for trajectory in trajectories:
        if trajectory.rollout_id not in done:
            pending.append(trajectory)
            if limit is not None and len(pending) >= limit:
                break
    return pending


def _label(run_id: str, rollout_id: str, value: str | float, reviewer: str, note: str) -> Label:
    from reprorl.evaluation.labels import Label, now

    return Label.model_validate(
        {
            "run_id": run_id,
            "rollout_id": rollout_id,
            "label": value,
            "reviewer": reviewer,
            "note": note,
            "time": now(),
        }
    )


@dataclass(frozen=True)
class _Answer:
    """What the reviewer typed: a label (with a note), skip, quit, next turn, or nothing understood."""

    action: Literal["label", "skip", "quit", "next", "invalid"]
    value: str | float = ""
    note: str = ""


def _show_and_ask(trajectory: Trajectory, prompt: str | None) -> _Answer:
    """Show the rollout's header, then one turn per Enter; a verdict may come at any turn."""
    reward = trajectory.reward.total if trajectory.reward else None
    console.print(
        f"{trajectory.rollout_id} · task {trajectory.task_id} · {trajectory.split.value} · "
        f"ended {trajectory.termination.value} · reward {reward if reward is not None else '-'}",
        markup=False,
    )
    console.print(
        f"task: {prompt}" if prompt else "task: (prompt not found in the run's task sets)", markup=False
    )
    turns = trajectory.turns
    if not turns:
        console.print(
            "(no turns)" + (f" error: {trajectory.error}" if trajectory.error else ""), markup=False
        )
    shown = 0
    if turns:
        _show_turn(trajectory, 0)
        shown = 1
    while True:
        more = shown < len(turns)
        console.print(f"{'Enter: next turn · ' if more else ''}{ASK} > ", end="", markup=False)
        sys.stdout.flush()
        line = sys.stdin.readline()
        if not line:
            console.print()
            return _Answer("quit")  # end of input: stop as if asked to; saved labels stay
        answer = _parse(line)
        if answer.action == "next":
            if more:
                _show_turn(trajectory, shown)
                shown += 1
            else:
                console.print("that was the last turn: answer p, f, a score, s or q")
        elif answer.action == "invalid":
            console.print(f"not understood: {line.strip()!r}; {ASK}", markup=False)
        else:
            return answer


def _parse(line: str) -> _Answer:
    text = line.strip()
    if not text:
        return _Answer("next")
    head, _, rest = text.partition(" ")
    word, note = head.lower(), rest.strip()
    if word in ("q", "quit"):
        return _Answer("quit")
    if word in ("s", "skip"):
        return _Answer("skip")
    if word in ("p", "pass", "f", "fail"):
        return _Answer("label", "pass" if word.startswith("p") else "fail", note)
    try:
        value = float(word)
    except ValueError:
        return _Answer("invalid")
    return _Answer("label", value, note) if 0.0 <= value <= 1.0 else _Answer("invalid")


def _show_turn(trajectory: Trajectory, index: int) -> None:
    turn = trajectory.turns[index]
    console.print(f"\n── turn {index + 1}/{len(trajectory.turns)} ──", markup=False)
    console.print(f"assistant: {_cut(turn.text)}", markup=False)
    for result in turn.tool_results:
        shown = result.content if result.error is None else f"{result.error} {result.content}".strip()
        console.print(f"  tool {result.name} ({result.outcome.value}): {_cut(shown)}", markup=False)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + f"… ({len(text) - MAX_SHOWN} more chars)"


class _TaskLookup:
    """The task prompts of the run's task sets, loaded once; a prompt is only shown, never required."""

    def __init__(self, store: Store, record: RunRecord) -> None:
        self._store = store
        self._record = record
        self._tasks: dict[str, Task] | None = None

    def prompt(self, trajectory: Trajectory) -> str | None:
        from reprorl.evaluation.judge import task_text

        task = self._load().get(trajectory.task_id)
        return task_text(task) if task is not None and task.content_hash == trajectory.task_hash else None

    def _load(self) -> dict[str, Task]:
        if self._tasks is None:
            self._tasks = {}
            try:
                from reprorl.orchestrate.jobs.judge_run import run_tasks

                self._tasks = run_tasks(self._store, self._record)
            except (ReprorlError, ValidationError):
                pass  # a spec or task set that cannot be read leaves the prompt out, not the review
        return self._tasks


def _print_agreement(record: RunRecord, reviewer: str | None) -> None:
    """Judge vs human, for every judge that scored this run; nothing when no judge has."""
    from reprorl.evaluation.judge import read_scores
    from reprorl.evaluation.labels import agreement, read_labels

    scores = read_scores(record)
    if not scores:
        return
    labels = read_labels(record)
    for judge in sorted({s.judge for s in scores}):
        result = agreement(scores, labels, judge=judge, reviewer=reviewer)
        who = reviewer or "newest labels"
        if result.percent is None:
            console.print(f"judge {judge} vs {who}: no rollout both judged and labelled yet", markup=False)
            continue
        kappa = f"{result.kappa:.2f}" if result.kappa is not None else "undefined"
        console.print(
            f"judge {judge} vs {who}: {result.percent:.1f}% agree, Cohen's kappa {kappa} (n={result.n})",
            markup=False,
        )
