"""`reprorl tasks merge`: one task set from several (a mixed-family train set), with its lineage."""

from __future__ import annotations

from collections import Counter

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.errors import UserInputError
from reprorl.refs import parse_ref
from reprorl.types import Task, TaskSet


def merge(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The merged set's artifact name, e.g. mixed-train."),
    sources: list[str] = typer.Argument(
        ..., help="Task sets to merge, in order (a bare name is its newest version)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the registered version as JSON."),
) -> None:
    """Register NAME as the tasks of SOURCES, in order, each kept as it is (id, family, split, hash).

    Every source is recorded as a parent (`merged_from`). A task id found in two sources is refused
    unless the two tasks are identical (then it is kept once): a merged set never holds two tasks
    under one id.
    """
    parse_ref(f"{name}@v1")
    store = options(ctx).store()
    if len(sources) < 2:
        raise UserInputError("give at least two task sets to merge", field="SOURCES")
    tasks: dict[str, Task] = {}
    hashes: dict[str, str] = {}
    parents: list[str] = []
    for given in sources:
        ref = store.pin_newest(given)  # a bare name is its newest version
        resolved = store.resolve(ref)
        parents.append(resolved.hash)
        for task in store.taskset(ref).tasks:
            seen = hashes.get(task.id)
            if seen is not None and seen != task.content_hash:
                raise UserInputError(
                    f"task id {task.id!r} is in two of the sets with different content ({ref} and an "
                    "earlier one); rename one of them, or merge without one of the sets",
                    field="SOURCES",
                )
            tasks[task.id], hashes[task.id] = task, task.content_hash
    merged = TaskSet(name=name, tasks=tuple(tasks.values()))
    families = Counter(t.family for t in merged.tasks)
    splits = Counter(t.split.value for t in merged.tasks)
    meta = {"tasks": len(merged.tasks), "families": dict(families), "splits": dict(splits)}
    version = store.add_bytes(name, merged.to_jsonl(), kind="taskset", meta={**meta, "merged_from": parents})
    for parent in dict.fromkeys(parents):
        store.registry.link(version.hash, parent, "merged_from")
    row = {"ref": version.ref, "hash": version.hash, **meta, "merged_from": parents}
    if as_json:
        print_json(row)
        return
    shares = ", ".join(f"{family} {count}" for family, count in sorted(families.items()))
    console.print(f"{version.ref}  {len(merged.tasks)} tasks ({shares})  {version.hash}")
