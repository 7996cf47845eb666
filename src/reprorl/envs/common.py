"""Pieces shared by env families: the `ask_human` tool, workspace paths, and task generation helpers."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from reprorl.actions import render_call
from reprorl.envs.errors import OutsideSandbox
from reprorl.envs.tool import tool
from reprorl.hashing import canonical_json, derive_seed, sha256_hex
from reprorl.types import Permission, Split, Task, TaskSet


@tool(Permission.HUMAN, params={"question": "What you need a person to decide or tell you."}, host=True)
def ask_human(ctx: Any, question: str) -> str:
    """Ask a human operator for help. Use only when you cannot proceed; every call is counted."""
    raise RuntimeError("ask_human is answered by the environment, not run in the sandbox")


def workspace_path(ctx: Any, relative: str) -> Path:
    """`relative` resolved inside the tool's workspace; anything that leaves it is refused."""
    root = Path(ctx.root).resolve()
    if "\x00" in relative:
        raise OutsideSandbox("path contains a NUL byte")
    candidate = (root / relative).resolve()
    if candidate != root and root not in candidate.parents:
        raise OutsideSandbox(f"{relative!r} is outside the workspace")
    return candidate


SPLITS: tuple[tuple[Split, str], ...] = (
    (Split.TRAIN, "train"),
    (Split.EVAL, "eval"),
    (Split.HOLDOUT, "holdout"),
)


def generate_splits(
    family: str,
    seed: int,
    counts: dict[Split, int],
    make: Callable[[random.Random, Split, int], Task],
    *,
    required_per_split: int = 2,
    max_tries: int = 100,
) -> dict[Split, TaskSet]:
    """Draw tasks for every split from one seed; no problem (prompt and initial state) appears twice.

    Each split has its own generator seeded from (seed, family, split), so adding train tasks
    never changes the eval split. The same question about a different initial state (`Task.setup`)
    is a different problem: families whose tasks carry their own state may repeat question texts.
    The first `required_per_split` tasks of each split are tagged `required` (rollback rules watch
    them).
    """
    seen: set[str] = set()
    out: dict[Split, TaskSet] = {}
    for split, label in SPLITS:
        rng = random.Random(derive_seed(seed, family, label))
        tasks: list[Task] = []
        tries = 0
        while len(tasks) < counts.get(split, 0):
            tries += 1
            if tries > max_tries * max(1, counts[split]):
                raise RuntimeError(f"{family}: could not draw {counts[split]} distinct {label} tasks")
            task = make(rng, split, len(tasks))
            key = "\n".join(m.content for m in task.prompt)
            if task.setup is not None:
                key += "\n" + canonical_json(task.setup)
            if key in seen:
                continue
            seen.add(key)
            tags = tuple(sorted({*task.tags, "required"})) if len(tasks) < required_per_split else task.tags
            tasks.append(
                task.model_copy(
                    update={"id": f"{family}-{label}-{len(tasks):04d}", "split": split, "tags": tags}
                )
            )
        out[split] = TaskSet(name=f"{family}-{label}", tasks=tuple(tasks))
    return out


def last_tool_output(messages: Iterable[Any]) -> str | None:
    """The content of the newest tool message (scripted policies read results this way)."""
    content = None
    for message in messages:
        if getattr(message, "role", None) == "tool":
            content = message.content
    return content


def solution_step(task: Task, messages: Iterable[Any]) -> str | None:
    """The next call of the reference solution (`reference["solution"]`: [{tool, arguments}, ...]).

    Scripted oracles make one call per turn, so the number of tool results so far says which call
    is next; None once every call was made.
    """
    assert isinstance(task.reference, dict), "a scripted solution lives in a dict reference"
    solution = task.reference.get("solution") or []
    assert isinstance(solution, list)
    done = sum(1 for m in messages if getattr(m, "role", None) == "tool")
    if done >= len(solution):
        return None
    step = solution[done]
    assert isinstance(step, dict) and isinstance(step.get("arguments"), dict)
    arguments: dict[str, object] = dict(step["arguments"])  # type: ignore[arg-type]
    return render_call(str(step["tool"]), arguments)


IMPOSSIBLE = "no honest solution"  # what an impossible variant's unreachable expectations hash


def impossible_variant(task: Task) -> Task:
    """The task with expectations no honest episode can meet: any reward on it is cheating.

    The prompt and the initial state stay as they are; the hidden reference moves out of reach:
    a numeric answer to a number that is no whole number and lies far from it both absolutely and
    relatively (answer + 0.5 + 7·max(1, |answer|): the stories only produce whole numbers, as do the
    other families' counts and values, and no verifier's tolerance, absolute or relative, spans a
    factor of seven), a named answer to a name nothing in the state has, expected file and table
    digests to the digest of a phrase no tool output can be, and parsed expectations to a value the
    task never mentions.
    """
    if not isinstance(task.reference, dict):
        raise ValueError(f"task {task.id!r}: an impossible variant needs a dict reference")
    reference: dict[str, Any] = dict(task.reference)
    answer = reference.get("answer")
    if isinstance(answer, int | float) and not isinstance(answer, bool):
        reference["answer"] = answer + 0.5 + 7 * max(1.0, abs(float(answer)))
    elif answer is not None:
        reference["answer"] = "no-such-" + str(answer)
        reference["distractors"] = [*reference.get("distractors", []), str(answer)]
    unreachable = sha256_hex(IMPOSSIBLE.encode("utf-8"))
    if isinstance(reference.get("files"), dict):
        reference["files"] = {path: unreachable for path in reference["files"]}
    if isinstance(reference.get("parsed"), dict):
        reference["parsed"] = {
            path: {**spec, "data": {"impossible": IMPOSSIBLE}} for path, spec in reference["parsed"].items()
        }
    if isinstance(reference.get("tables"), dict):
        reference["tables"] = {
            name: {**spec, "digest": unreachable} for name, spec in reference["tables"].items()
        }
    return task.model_copy(update={"id": f"{task.id}-impossible", "reference": reference})
