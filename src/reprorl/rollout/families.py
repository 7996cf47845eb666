"""Env families: an env bound to its verifier, task generator and oracle, registered by name.

Envs and verifiers are separate layers (a verifier must be testable without an env), so a family
is the pairing made one level up, here. A family is registered where it is defined — the
`@family(...)` decorator on its env class, or `register_family(Family(...))` — and an installed
package offers its own through the entry-point group `reprorl.families` (the entry point's name is
the family's; its value the decorated env class, the `Family`, or a module that registers it), so a
task whose `family` names it runs with no change to reprorl and no launcher script.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from reprorl.envs.base import ToolEnv
from reprorl.envs.common import impossible_variant
from reprorl.registry import Registry
from reprorl.rewards.base import Verifier
from reprorl.rollout.episode import Script
from reprorl.types import Split, Task, TaskSet

Generator = Callable[..., dict[Split, TaskSet]]
E = TypeVar("E", bound=type[ToolEnv])


@dataclass(frozen=True)
class Family:
    """Everything needed to run, score and test one kind of task."""

    name: str
    env: type[ToolEnv]
    verifier: Verifier
    generate: Generator
    """`generate(seed=..., **counts) -> {split: TaskSet}`: the family's seeded task sets."""
    oracle: Script
    """A scripted policy that solves any task of the family (reward audits, SFT demonstrations)."""
    tool_modules: tuple[str, ...]
    """Modules the sandbox imports so it can run the family's tools, found wherever they are installed."""
    impossible: Callable[[Task], Task] = impossible_variant
    """A variant of a task that no honest episode can solve: the reward audit runs the oracle on it,
    and any reward there is cheating. The default moves the hidden reference out of reach (see
    `impossible_variant`); a family whose references it does not understand gives its own."""
    cross: tuple[Verifier, ...] = ()
    """Independent second verifiers of the same tasks: each scores the same final state, and where one
    disagrees with `verifier` the reward is in doubt (recorded as `cross/<class>`, never weighted)."""

    @property
    def identity(self) -> tuple[str, str]:
        return self.env.__module__, self.env.__qualname__


def _accept(name: str, loaded: object) -> Family | None:
    if isinstance(loaded, Family):
        return loaded
    found = getattr(loaded, "__reprorl_family__", None)
    return found if isinstance(found, Family) else None


FAMILIES: Registry[Family] = Registry(
    "env family",
    "reprorl.families",
    builtins=("reprorl.rollout.builtin_families",),
    accept=_accept,
    plural="env families",
)


def families_named(names: Iterable[str]) -> dict[str, Family]:
    """The families of these names (each loaded, from its package if need be), by name."""
    return {name: FAMILIES[name] for name in sorted(set(names))}


def register_family(family: Family) -> Family:
    """Make `family` runnable by name: tasks whose `family` is `family.name` run with it."""
    return FAMILIES.add(family.name, family, module=family.env.__module__)


def family(
    name: str,
    *,
    verifier: Verifier,
    generate: Generator,
    oracle: Script,
    tool_modules: Sequence[str] = (),
    impossible: Callable[[Task], Task] = impossible_variant,
    cross: Sequence[Verifier] = (),
) -> Callable[[E], E]:
    """Register the decorated env class as family `name`, with these parts; its tools are in
    `tool_modules` (by default the env's own module)."""

    def decorate(env: E) -> E:
        made = Family(
            name,
            env,
            verifier,
            generate,
            oracle,
            tuple(tool_modules) or (env.__module__,),
            impossible,
            tuple(cross),
        )
        register_family(made)
        env.__reprorl_family__ = made  # type: ignore[attr-defined]  # what an entry point finds
        return env

    return decorate


def get_family(name: str) -> Family:
    return FAMILIES[name]
