"""`reprorl tasks generate`: a registered env family's seeded task sets, registered as PREFIX-<split>."""

from __future__ import annotations

import inspect
from typing import Any

import typer

from reprorl.cli.context import options
from reprorl.cli.output import console, print_json
from reprorl.errors import UserInputError
from reprorl.refs import parse_ref
from reprorl.rollout.families import FAMILIES, Family
from reprorl.types import Split, TaskSet

_SPLITS = set(Split)


def generate(
    ctx: typer.Context,
    family: str = typer.Argument(..., help="A registered env family (list them: reprorl tasks families)."),
    seed: int = typer.Option(0, "--seed", help="Seed of every split; the same seed gives the same tasks."),
    train: int | None = typer.Option(None, "--train", min=0, help="Train tasks (default: the family's)."),
    eval_: int | None = typer.Option(None, "--eval", min=0, help="Eval tasks (default: the family's)."),
    holdout: int | None = typer.Option(
        None, "--holdout", min=0, help="Holdout tasks (default: the family's)."
    ),
    name: str | None = typer.Option(
        None,
        "--name",
        metavar="PREFIX",
        help="Register the splits as PREFIX-train, PREFIX-eval, PREFIX-holdout (default: the family's name).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the registered task sets as JSON."),
) -> None:
    """Generate FAMILY's train, eval and holdout task sets from one seed; register each as PREFIX-<split>.

    Unchanged tasks keep their version: a rerun with the same seed and counts registers nothing new.
    A split of zero tasks is not registered.
    """
    found = FAMILIES.get_part(family, field="FAMILY")
    prefix = name or family
    for split in Split:  # every name checked before anything is generated or written
        parse_ref(f"{prefix}-{split.value}@v1")
    counts = {
        split.value: count
        for split, count in ((Split.TRAIN, train), (Split.EVAL, eval_), (Split.HOLDOUT, holdout))
        if count is not None
    }
    sets = _generated(found, seed, counts)
    store = options(ctx).store()
    registered: list[dict[str, Any]] = []
    for split, tasks in sets.items():
        if not tasks.tasks:
            continue
        artifact = f"{prefix}-{split.value}"
        before = {v.hash for v in store.registry.versions(artifact)} if store.has_registry() else set()
        version = store.add_bytes(
            artifact,
            tasks.to_jsonl(),
            kind="taskset",
            meta={"tasks": len(tasks.tasks), "family": family, "split": split.value, "seed": seed},
        )
        registered.append(
            {
                "name": version.name,
                "version": f"v{version.version}",
                "ref": version.ref,
                "hash": version.hash,
                "split": split.value,
                "tasks": len(tasks.tasks),
                "unchanged": version.hash in before,
            }
        )
    if as_json:
        print_json({"family": family, "seed": seed, "tasksets": registered})
        return
    for row in registered:
        note = " (content unchanged)" if row["unchanged"] else ""
        console.print(f"{row['name']}@{row['version']}  {row['tasks']} tasks  {row['hash']}{note}")
    for split in Split:
        if split in sets and not sets[split].tasks:
            console.print(f"{prefix}-{split.value}: no tasks, not registered")


def _generated(found: Family, seed: int, counts: dict[str, int]) -> dict[Split, TaskSet]:
    """The family's task sets for `seed`, passing it only the counts given; checked before any is stored."""
    try:
        inspect.signature(found.generate).bind(seed=seed, **counts)
    except TypeError as exc:
        options_given = ", ".join(f"--{key}" for key in counts) or "--seed"
        raise UserInputError(
            f"env family {found.name!r}'s generator does not take {options_given} ({exc})",
            field="FAMILY",
        ) from None
    except ValueError:
        pass  # no signature to read (a builtin or C callable): let the call itself decide
    try:
        made = found.generate(seed=seed, **counts)
    except (ValueError, RuntimeError) as exc:  # e.g. more distinct tasks asked for than it can draw
        raise UserInputError(
            f"env family {found.name!r} could not generate these task sets: {exc}", field="FAMILY"
        ) from exc
    if not isinstance(made, dict) or not all(
        split in _SPLITS and isinstance(tasks, TaskSet) for split, tasks in made.items()
    ):
        raise UserInputError(
            f"env family {found.name!r}'s generator returned {type(made).__name__}, "
            "not a {split: TaskSet} dict",
            field="FAMILY",
        )
    return {split: made[split] for split in Split if split in made}
