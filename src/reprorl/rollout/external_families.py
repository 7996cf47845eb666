"""Families over environments other programs serve: an OpenEnv server made a reprorl family by registration.

`openenv_family(name, server, ...)` is the whole adapter a team writes: it returns a `Family` (to
hand to `register_family`, or to export through the `reprorl.families` entry point) whose env talks
to the server over OpenEnv's WebSocket protocol, whose verifier scores what the server reported
(`EnvReported`), and whose tasks are the server's `reset` arguments (seeds, by default) under one
instruction. The server is started by reprorl on 127.0.0.1 when the first episode needs it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Literal

from reprorl.envs.common import generate_splits
from reprorl.envs.external.openenv_server import OpenEnvServer, OpenEnvServerSpec
from reprorl.rewards.verifiers.reported import EnvReported
from reprorl.rollout.episode import Script
from reprorl.rollout.families import Family
from reprorl.types import Message, Role, Split, Task, TaskSet

__all__ = ["OpenEnvServerSpec", "openenv_family", "openenv_tasks"]

MAX_SEED = 2**31 - 1


def openenv_tasks(
    family: str, instruction: str, *, reset: Callable[[random.Random], dict[str, Any]] | None = None
) -> Callable[..., dict[Split, TaskSet]]:
    """A generator of the family's task sets: each task one `reset` (by default `{"seed": n}`, drawn
    from the generator's seed) under `instruction`; no two tasks of a run's sets share a reset."""
    draw = reset or (lambda rng: {"seed": rng.randint(0, MAX_SEED)})

    def make(rng: random.Random, split: Split, index: int) -> Task:
        setup = draw(rng)
        return Task(
            id=f"{family}-{split.value}-{index:04d}",
            family=family,
            prompt=(Message(role=Role.USER, content=instruction),),
            setup=setup,
            split=split,
        )

    def generate(seed: int, *, train: int = 64, eval: int = 32, holdout: int = 32) -> dict[Split, TaskSet]:
        counts = {Split.TRAIN: train, Split.EVAL: eval, Split.HOLDOUT: holdout}
        return generate_splits(family, seed, counts, make)

    return generate


def openenv_family(
    name: str,
    server: OpenEnvServerSpec,
    *,
    tool: str,
    instruction: str,
    oracle: Script,
    impossible: Callable[[Task], Task],
    outcome: Literal["return", "last"] = "return",
    reset: Callable[[random.Random], dict[str, Any]] | None = None,
) -> Family:
    """A family whose episodes run on an OpenEnv server (see the module's docstring).

    `tool` names the server's action as the agent calls it; `oracle` is a scripted policy that
    solves the env (the reward audit and SFT demonstrations need one); `outcome` is what of the
    server's rewards scores an episode. `impossible` makes a variant of a task that no honest
    episode can solve (the reward audit runs the oracle on it, and any reward there is cheating);
    only the env knows how, so it has no default.
    """
    from reprorl.envs.external.openenv_env import openenv_env  # imports openenv-core

    env = openenv_env(name, OpenEnvServer(server), tool=tool, instruction=instruction)
    return Family(
        name,
        env,
        EnvReported(outcome=outcome),
        openenv_tasks(name, instruction, reset=reset),
        oracle,
        (),
        impossible,
    )


def served(family: Family) -> OpenEnvServer | None:
    """The OpenEnv server behind a family, if it has one (to stop or restart it)."""
    server = getattr(family.env, "server", None)
    return server if isinstance(server, OpenEnvServer) else None
