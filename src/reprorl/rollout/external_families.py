"""Families over environments written for other frameworks: OpenEnv servers and verifiers v1 tasksets.

`openenv_family(name, server, ...)` is the whole adapter a team writes: it returns a `Family` (to
hand to `register_family`, or to export through the `reprorl.families` entry point) whose env talks
to the server over OpenEnv's WebSocket protocol, whose verifier scores what the server reported
(`EnvReported`), and whose tasks are the server's `reset` arguments (seeds, by default) under one
instruction. The server is started by reprorl on 127.0.0.1 when the first episode needs it.
`verifiers_family(name, "module:Taskset", ...)` does the same for a verifiers v1 taskset: its tasks
become content-hashed reprorl tasks carrying their data and the taskset's own hash of it, and its
`@vf.reward` functions score each episode (`VerifiersRewards`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Literal

from reprorl.envs.common import generate_splits, impossible_variant
from reprorl.envs.external.openenv_server import OpenEnvServer, OpenEnvServerSpec
from reprorl.rewards.verifiers.reported import EnvReported
from reprorl.rewards.verifiers.verifiers_taskset import VerifiersRewards
from reprorl.rollout.episode import Script
from reprorl.rollout.families import Family
from reprorl.types import Message, Role, Split, Task, TaskSet
from reprorl.verifiers_v1 import load_taskset

__all__ = ["OpenEnvServerSpec", "openenv_family", "openenv_tasks", "verifiers_family", "verifiers_tasks"]

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


def verifiers_tasks(
    family: str, taskset: str, config: dict[str, Any] | None = None
) -> Callable[..., dict[Split, TaskSet]]:
    """A generator of the family's task sets from a verifiers v1 taskset: its tasks, shuffled by the
    seed, dealt into train, eval and holdout. Each carries its data and the taskset's content hash
    of it (`reference`, hidden from the agent; the hash also as the tag `verifiers:<hash>`)."""

    def generate(seed: int, *, train: int = 64, eval: int = 32, holdout: int = 32) -> dict[Split, TaskSet]:
        loaded = load_taskset(taskset, config or {})
        tasks = list(loaded)
        random.Random(seed).shuffle(tasks)
        out: dict[Split, TaskSet] = {}
        start = 0
        for split, count in ((Split.TRAIN, train), (Split.EVAL, eval), (Split.HOLDOUT, holdout)):
            chosen = tasks[start : start + count]
            start += len(chosen)
            out[split] = TaskSet(
                name=f"{family}-{split.value}",
                tasks=tuple(_task(family, t, split) for t in chosen),
            )
        return out

    return generate


def _task(family: str, vf_task: Any, split: Split) -> Task:
    data = vf_task.data
    prompt = data.prompt
    messages: list[Message] = []
    if data.system_prompt:
        messages.append(Message(role=Role.SYSTEM, content=data.system_prompt))
    if isinstance(prompt, str):
        messages.append(Message(role=Role.USER, content=prompt))
    else:
        for item in prompt or []:
            content = getattr(item, "content", "")
            messages.append(
                Message(role=Role(item.role), content=content if isinstance(content, str) else "")
            )
    return Task(
        id=f"{family}-{data.id or vf_task.key[:16]}",
        family=family,
        prompt=tuple(messages),
        reference={"data": data.model_dump(mode="json"), "hash": vf_task.hash, "key": vf_task.key},
        split=split,
        tags=(f"verifiers:{vf_task.hash}",),
    )


def verifiers_family(
    name: str,
    taskset: str,
    *,
    oracle: Script,
    config: dict[str, Any] | None = None,
    impossible: Callable[[Task], Task] = impossible_variant,
    tool_timeout_s: float = 30.0,
) -> Family:
    """A family over the verifiers v1 taskset `taskset` (`module:Class`), built with `config` (its
    `TasksetConfig` as JSON). `oracle` is a scripted policy that solves its tasks (reprorl's reward
    audit and SFT demonstrations need one; verifiers tasksets have none of their own). The toolsets
    of the taskset and its task are the agent's tools, each call limited to `tool_timeout_s`."""
    from reprorl.envs.external.verifiers_env import TOOLSETS, verifiers_env

    env = verifiers_env(name, taskset, config or {}, tool_timeout_s=tool_timeout_s)
    # The sandbox imports the taskset's module (its toolsets are there) and the code that runs them.
    modules = (taskset.partition(":")[0], TOOLSETS) if env.tools else ()
    return Family(
        name,
        env,
        VerifiersRewards(taskset=taskset, config=dict(config or {})),
        verifiers_tasks(name, taskset, config),
        oracle,
        modules,
        impossible,
    )
