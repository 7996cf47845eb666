"""The files family: questions about a tree of service configs and edits to make in it, done through tools.

Every task gets its own seeded tree, written into the sandbox from `Task.setup` by `build_state`.
The verifier (`rewards.verifiers.files.FileTreeState`) judges the files the episode leaves behind.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from reprorl.envs.base import ToolEnv
from reprorl.envs.common import ask_human, generate_splits, solution_step
from reprorl.envs.families.files_tasks import KINDS
from reprorl.envs.families.files_tools import build_state, cat, grep, ls, move, write_file
from reprorl.envs.families.files_tree import format_of, generate_tree, parse
from reprorl.hashing import sha256_hex
from reprorl.types import Message, Role, Split, Task, TaskSet

FAMILY = "files"
MAX_DRAWS = 100
SETUP_TIMEOUT_S = 30.0


class FilesEnv(ToolEnv):
    family = FAMILY
    tools = (ls, cat, grep, write_file, move, ask_human)
    system_prompt = (
        "You manage service configuration files in a workspace through tools. Live service configs are the"
        " files named config.ini, config.toml or config.json under services/; files ending in .bak are old"
        " backups, templates/ holds templates, and docs/ may be out of date."
        ' Call a tool by writing <tool_call>{"name": "grep", "arguments": {"pattern": "port"}}</tool_call>.'
        " write_file replaces a whole file. Change only what the task asks. When you are done, reply without"
        " a tool call; to a question, reply with just the answer."
    )

    setup_fn = staticmethod(build_state)
    setup_timeout_s = SETUP_TIMEOUT_S


TOOL_NAMES = tuple(t.name for t in FilesEnv.tools)


def _make(rng: random.Random, split: Split, index: int) -> Task:
    kind = rng.choice(KINDS)  # kinds are equally likely; a tree that does not fit the kind is redrawn
    for _ in range(MAX_DRAWS):
        tree = generate_tree(rng)
        draft = kind(rng, tree)
        if draft is not None:
            break
    else:
        raise RuntimeError(f"{kind.__name__}: no fitting tree in {MAX_DRAWS} draws")
    is_answer = draft.final is None
    final = draft.final or tree.files
    reference: dict[str, Any] = {
        "kind": "answer" if is_answer else "change",
        "files": {p: sha256_hex(t.encode("utf-8")) for p, t in final.items() if p not in draft.edited},
        "parsed": {p: {"format": format_of(p), "data": parse(format_of(p), final[p])} for p in draft.edited},
        "targets": list(draft.targets),
        "answer": draft.answer,
        "distractors": list(draft.distractors),
        "solution": [{"tool": tool, "arguments": arguments} for tool, arguments in draft.calls],
    }
    suffix = "" if is_answer else " When you are done, reply with a one-line summary."
    return Task(
        id=f"{FAMILY}-{index}",
        family=FAMILY,
        prompt=(Message(role=Role.USER, content=draft.text + suffix),),
        tools=TOOL_NAMES,
        setup={"files": tree.files},
        reference=reference,
        difficulty=draft.difficulty,
        reference_steps=len(draft.calls),
        tags=(draft.kind, "answer" if is_answer else "change"),
    )


def generate(seed: int, *, train: int = 64, eval: int = 32, holdout: int = 32) -> dict[Split, TaskSet]:
    """Deterministic train / eval / holdout task sets for the files family."""
    counts = {Split.TRAIN: train, Split.EVAL: eval, Split.HOLDOUT: holdout}
    return generate_splits(FAMILY, seed, counts, _make)


def oracle(task: Task, messages: Sequence[Message]) -> str:
    """Make the reference solution's calls one per turn, then answer (or confirm) from the reference."""
    assert isinstance(task.reference, dict)
    call = solution_step(task, messages)
    if call is not None:
        return call
    if task.reference["kind"] == "answer":
        return str(task.reference["answer"])
    return "Done."
