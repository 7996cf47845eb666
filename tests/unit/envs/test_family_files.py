"""The files family: workspace-bound tools, deterministic splits, a verifier that parses what it must."""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from reprorl.actions import parse_action
from reprorl.envs.errors import InvalidArguments, OutsideSandbox, UnsafeAction
from reprorl.envs.families import files_tools
from reprorl.envs.families.files import FilesEnv, generate, oracle
from reprorl.envs.families.files_tools import (
    MAX_CAT_LINES,
    MAX_ENTRIES,
    MAX_MATCHES,
    MAX_WRITE_BYTES,
    build_state,
    cat,
    grep,
    ls,
    move,
    write_file,
)
from reprorl.envs.families.files_tree import generate_tree, parse, render
from reprorl.hashing import canonical_json
from reprorl.rewards import FinalState
from reprorl.rewards.verifiers.files import FileTreeState
from reprorl.rollout.families import FAMILIES
from reprorl.types import Message, Role, Split, Task, Termination

TOOLS = {t.name: t for t in (ls, cat, grep, write_file, move)}
VERIFIER = FileTreeState()


def _ctx(root: Path) -> SimpleNamespace:
    return SimpleNamespace(root=root)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def ctx(tmp_path: Path) -> SimpleNamespace:
    root = tmp_path / "work"
    root.mkdir()
    (tmp_path / "secret.txt").write_text("outside the workspace\n")
    context = _ctx(root)
    build_state(context, {"files": generate_tree(random.Random(5)).files})
    return context


@pytest.fixture(scope="module")
def eval_tasks() -> tuple[Task, ...]:
    return generate(0)[Split.EVAL].tasks


# -- tools -----------------------------------------------------------------------------------------


def test_ls_cat_grep(ctx: SimpleNamespace) -> None:
    top = ls(ctx)
    assert top.splitlines() == ["docs/", "services/", "shared/", "templates/"]
    assert ls(ctx, path="shared").startswith("defaults.toml (")
    assert cat(ctx, path="shared/defaults.toml").startswith("[limits]\ntimeout = 30")
    hits = grep(ctx, pattern="service_name", path="services").splitlines()
    assert hits and all(":" in h and h.startswith("services/") for h in hits)
    assert grep(ctx, pattern=r"port\s*=\s*\d{4}$", regex=True) != "no matches"
    assert grep(ctx, pattern="no such text anywhere") == "no matches"
    with pytest.raises(InvalidArguments, match="directory"):
        cat(ctx, path="services")
    with pytest.raises(InvalidArguments, match="no such file"):
        cat(ctx, path="nope.txt")


def test_write_and_move(ctx: SimpleNamespace) -> None:
    assert write_file(ctx, path="notes/todo.txt", content="x = 1\n") == "wrote 6 bytes to notes/todo.txt"
    assert cat(ctx, path="notes/todo.txt") == "x = 1\n"
    assert move(ctx, src="notes/todo.txt", dst="archive/") == "moved notes/todo.txt to archive/todo.txt"
    assert (
        move(ctx, src="archive/todo.txt", dst="archive/done.txt")
        == "moved archive/todo.txt to archive/done.txt"
    )
    assert not (ctx.root / "archive/todo.txt").exists() and (ctx.root / "archive/done.txt").exists()


def test_refusals(ctx: SimpleNamespace) -> None:
    before = _snapshot(ctx.root)
    with pytest.raises(UnsafeAction, match="already exists"):
        move(ctx, src="shared/defaults.toml", dst="docs/ports.md")
    with pytest.raises(InvalidArguments):
        move(ctx, src=".", dst="elsewhere")
    with pytest.raises(InvalidArguments):
        move(ctx, src="services", dst="services/inside")
    with pytest.raises(InvalidArguments, match="limit"):
        write_file(ctx, path="big.txt", content="x" * (MAX_WRITE_BYTES + 1))
    with pytest.raises(InvalidArguments):
        write_file(ctx, path="services/", content="x")
    for pattern in ("(a+)+$", "(a|aa)*b", r"(\w+\s?)+x", r"(a)\1", "x" * 101, "a*b*c*d*e*f"):
        with pytest.raises(InvalidArguments):
            grep(ctx, pattern=pattern, regex=True)
    with pytest.raises(InvalidArguments, match="regular expression"):
        grep(ctx, pattern="([unclosed", regex=True)
    assert _snapshot(ctx.root) == before


@pytest.mark.parametrize("path", ["../secret.txt", "/etc/passwd", "services/../../secret.txt", "link_out"])
def test_paths_outside_the_workspace_are_refused(ctx: SimpleNamespace, path: str) -> None:
    (ctx.root / "link_out").symlink_to(ctx.root.parent / "secret.txt")
    calls: list[Callable[[], str]] = [
        lambda: cat(ctx, path=path),
        lambda: ls(ctx, path=path),
        lambda: grep(ctx, pattern="outside", path=path),
        lambda: write_file(ctx, path=path, content="overwritten"),
        lambda: move(ctx, src=path, dst="stolen.txt"),
        lambda: move(ctx, src="docs/ports.md", dst=path),
    ]
    for call in calls:
        with pytest.raises(OutsideSandbox):
            call()
    assert (ctx.root.parent / "secret.txt").read_text() == "outside the workspace\n"


def test_links_inside_the_tree_are_not_followed_by_grep(ctx: SimpleNamespace) -> None:
    (ctx.root / "services" / "escape").symlink_to(ctx.root.parent)
    assert "outside the workspace" not in grep(ctx, pattern="outside")
    assert "escape@ (link)" in ls(ctx, path="services")


def test_outputs_are_capped(ctx: SimpleNamespace) -> None:
    for i in range(MAX_ENTRIES + 20):
        write_file(ctx, path=f"many/f{i:03d}.txt", content="needle\n" * 3)
    listing = ls(ctx, path="many").splitlines()
    assert len(listing) == MAX_ENTRIES + 1 and listing[-1] == "(20 more entries not shown)"
    found = grep(ctx, pattern="needle", path="many").splitlines()
    assert (
        len(found) == MAX_MATCHES + 1
        and found[-1] == f"({3 * (MAX_ENTRIES + 20) - MAX_MATCHES} more matches not shown)"
    )
    write_file(ctx, path="long.txt", content="".join(f"line {i}\n" for i in range(MAX_CAT_LINES + 50)))
    shown = cat(ctx, path="long.txt")
    assert shown.endswith("[50 more lines not shown]") and shown.count("\n") == MAX_CAT_LINES
    write_file(ctx, path="wide.txt", content="y" * 20_000)
    assert "[cut at 8000 characters" in cat(ctx, path="wide.txt")


# -- generation ------------------------------------------------------------------------------------


def test_generation_is_deterministic_disjoint_and_tagged() -> None:
    first, again, other = generate(3), generate(3), generate(4)
    assert {s: t.version for s, t in first.items()} == {s: t.version for s, t in again.items()}
    assert all(first[s].version != other[s].version for s in first)
    # The same question may recur about a different tree; the same problem never does.
    problems = {
        s: {(t.prompt[-1].content, canonical_json(t.setup)) for t in ts.tasks} for s, ts in first.items()
    }
    assert sum(map(len, problems.values())) == sum(len(ts.tasks) for ts in first.values())
    assert not (problems[Split.TRAIN] | problems[Split.HOLDOUT]) & problems[Split.EVAL]
    assert [len(first[s].tasks) for s in (Split.TRAIN, Split.EVAL, Split.HOLDOUT)] == [64, 32, 32]
    for split, tasks in first.items():
        for task in tasks.tasks:
            assert task.split == split and task.family == "files" and task.difficulty in (1, 2, 3)
            assert isinstance(task.reference, dict) and task.reference["kind"] in task.tags
            assert task.reference_steps == len(task.reference["solution"])  # type: ignore[arg-type]
            assert set(task.tools) <= {t.name for t in FilesEnv.tools}
        assert ["required" in t.tags for t in tasks.tasks[:3]] == [True, True, False]
    assert generate(3, train=100)[Split.EVAL].version == first[Split.EVAL].version


def test_formats_round_trip() -> None:
    data: dict[str, dict[str, Any]] = {
        "service": {"service_name": "billing", "port": 8080},
        "limits": {"timeout": 30},
    }
    assert parse("json", render("json", data)) == data
    assert parse("toml", render("toml", data)) == data
    assert parse("ini", render("ini", data)) == {
        "service": {"service_name": "billing", "port": "8080"},
        "limits": {"timeout": "30"},
    }


def test_family_is_registered() -> None:
    family = FAMILIES["files"]
    assert family.env is FilesEnv and isinstance(family.verifier, FileTreeState)
    modules = {t.fn_ref.split(":")[0] for t in FilesEnv.tools if not t.host}
    assert modules <= set(family.tool_modules) and files_tools.__name__ in family.tool_modules


# -- verifier --------------------------------------------------------------------------------------


def _apply_solution(root: Path, task: Task) -> None:
    """The task's intended change made with plain file operations, not through the tools."""
    assert isinstance(task.reference, dict)
    for step in task.reference["solution"]:  # type: ignore[union-attr]
        assert isinstance(step, dict) and isinstance(step["arguments"], dict)
        arguments: dict[str, Any] = step["arguments"]
        if step["tool"] == "write_file":
            (root / arguments["path"]).write_text(arguments["content"])
        elif step["tool"] == "move":
            destination = root / arguments["dst"] / Path(arguments["src"]).name
            destination.parent.mkdir(parents=True, exist_ok=True)
            (root / arguments["src"]).rename(destination)


def _answer(task: Task) -> str:
    assert isinstance(task.reference, dict)
    return str(task.reference["answer"]) if task.reference["kind"] == "answer" else "Done."


def _score(task: Task, root: Path, answer: str) -> float:
    return VERIFIER.score(task, FinalState(answer, root, Termination.ANSWERED))["outcome"]


def test_verifier_on_every_eval_task(tmp_path: Path, eval_tasks: tuple[Task, ...]) -> None:
    for i, task in enumerate(eval_tasks):
        root = tmp_path / f"t{i}"
        root.mkdir()
        build_state(_ctx(root), task.setup)  # type: ignore[arg-type]
        is_change = isinstance(task.reference, dict) and task.reference["kind"] == "change"
        # (b) the state as it started: a change task is not done; a question still needs its answer.
        assert _score(task, root, "Done." if is_change else "") == 0.0
        # (a) the intended change (or the right answer) scores one.
        _apply_solution(root, task)
        assert _score(task, root, _answer(task)) == 1.0, task.tags
        # (c) the right change plus one unrelated change scores zero, and so does an extra file.
        defaults = root / "shared" / "defaults.toml"
        original = defaults.read_bytes()
        defaults.write_bytes(original.replace(b"workers = 2", b"workers = 3"))
        assert _score(task, root, _answer(task)) == 0.0
        defaults.write_bytes(original)
        (root / "notes.txt").write_text("hello\n")
        assert _score(task, root, _answer(task)) == 0.0


def test_edits_are_judged_by_value_not_by_formatting(tmp_path: Path, eval_tasks: tuple[Task, ...]) -> None:
    task = next(t for t in eval_tasks if isinstance(t.reference, dict) and t.reference["parsed"])
    assert isinstance(task.reference, dict) and isinstance(task.reference["parsed"], dict)
    build_state(_ctx(tmp_path), task.setup)  # type: ignore[arg-type]
    _apply_solution(tmp_path, task)
    path = next(iter(task.reference["parsed"]))
    target = tmp_path / path
    target.write_text("\n\n" + target.read_text().replace(" = ", "=").replace('": ', '" :  '))
    assert _score(task, tmp_path, "Done.") == 1.0
    text = target.read_text()
    for key in ("timeout", "workers"):
        text = text.replace(f"{key}=", f"{key}=1", 1).replace(f'"{key}" :  ', f'"{key}" :  1', 1)
    target.write_text(text)
    assert _score(task, tmp_path, "Done.") == 0.0


def test_verifier_never_follows_links(tmp_path: Path, eval_tasks: tuple[Task, ...]) -> None:
    task = next(t for t in eval_tasks if isinstance(t.reference, dict) and t.reference["kind"] == "change")
    assert isinstance(task.reference, dict)
    good, root = tmp_path / "good", tmp_path / "work"
    for where in (good, root):
        where.mkdir()
        build_state(_ctx(where), task.setup)  # type: ignore[arg-type]
        _apply_solution(where, task)
    assert _score(task, root, "Done.") == 1.0
    target = root / str(task.reference["targets"][0])  # type: ignore[index]
    target.unlink()
    target.symlink_to(good / str(task.reference["targets"][0]))  # type: ignore[index]
    assert _score(task, root, "Done.") == 0.0
    target.unlink()
    shutil.copy(good / str(task.reference["targets"][0]), target)  # type: ignore[index]
    (root / "services" / "loop").symlink_to(root)
    assert _score(task, root, "Done.") == 0.0


def test_answers_must_name_one_candidate(tmp_path: Path, eval_tasks: tuple[Task, ...]) -> None:
    task = next(t for t in eval_tasks if isinstance(t.reference, dict) and t.reference["distractors"])
    assert isinstance(task.reference, dict)
    build_state(_ctx(tmp_path), task.setup)  # type: ignore[arg-type]
    right = str(task.reference["answer"])
    assert _score(task, tmp_path, f"The {right} service.") == 1.0
    assert _score(task, tmp_path, " ".join([right, *map(str, task.reference["distractors"])])) == 0.0  # type: ignore[arg-type]


# -- the oracle, end to end without a sandbox ------------------------------------------------------


def _play(task: Task, root: Path, script: Any) -> tuple[str, int]:
    messages = list(task.prompt)
    calls = 0
    for _ in range(10):
        action = parse_action(script(task, messages))
        if action.is_final:
            return action.answer, calls
        for call in action.tool_calls:
            calls += 1
            content = TOOLS[call.name](_ctx(root), **call.arguments)
            messages.append(Message(role=Role.TOOL, content=content, tool_call_id=call.id, name=call.name))
    raise AssertionError("the script never answered")


def test_oracle_solves_every_eval_task_and_answering_at_once_never_does(
    tmp_path: Path, eval_tasks: tuple[Task, ...]
) -> None:
    for i, task in enumerate(eval_tasks):
        solved, lazy = tmp_path / f"o{i}", tmp_path / f"l{i}"
        for root in (solved, lazy):
            root.mkdir()
            build_state(_ctx(root), task.setup)  # type: ignore[arg-type]
        answer, calls = _play(task, solved, oracle)
        assert calls == task.reference_steps
        assert _score(task, solved, answer) == 1.0, task.tags
        guess, _ = _play(task, lazy, lambda t, m: "I am not sure; maybe 0.")
        assert _score(task, lazy, guess) == 0.0, task.tags


def test_the_oracle_reads_every_answer_and_every_file_it_rewrites_first(
    tmp_path: Path, eval_tasks: tuple[Task, ...]
) -> None:
    """A demonstration that answers or writes what its episode never showed teaches guessing."""
    for i, task in enumerate(generate(0)[Split.TRAIN].tasks + eval_tasks):
        root = tmp_path / f"r{i}"
        root.mkdir()
        build_state(_ctx(root), task.setup)  # type: ignore[arg-type]
        messages, read = list(task.prompt), set()
        while not (action := parse_action(oracle(task, messages))).is_final:
            for call in action.tool_calls:
                if call.name == "write_file":
                    assert call.arguments["path"] in read, (task.tags, call.arguments["path"])
                if call.name == "cat":
                    read.add(call.arguments["path"])
                content = TOOLS[call.name](_ctx(root), **call.arguments)
                messages.append(
                    Message(role=Role.TOOL, content=content, tool_call_id=call.id, name=call.name)
                )
        seen = "\n".join(m.content or "" for m in messages if m.role == Role.TOOL)
        if isinstance(task.reference["answer"], str):  # type: ignore[index]
            assert task.reference["answer"] in seen, task.tags  # type: ignore[index]
