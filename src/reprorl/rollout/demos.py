"""Demonstrations: an env family's oracle acting through the same token path as a model policy.

A demonstration is recorded like any rollout: its replies are tokenised and appended to a context
built by the model's own chat template, so supervised warm-start data has exactly the shape (and
the rendering) of the rollouts the policy will later produce. A chosen fraction can be made
deliberately imperfect — answering at once, without the tools — so that RL has work left to do.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from reprorl.actions import OPEN
from reprorl.envs.base import EnvConfig
from reprorl.envs.sandbox import SandboxPool
from reprorl.hashing import code_fingerprint, derive_seed
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import Sample, SampleRequest, stop_token_ids
from reprorl.rewards import VerifierRunner
from reprorl.rollout.episode import EpisodeIds, EpisodeLimits, PolicyOutput, Provenance, Script, run_episode
from reprorl.rollout.families import Family, families_named
from reprorl.rollout.model_policy import ModelPolicy
from reprorl.types import Message, SamplingParams, Task, Trajectory

GUESS = "42"  # what an imperfect demonstration answers without using its tools


class DemoPolicy(ModelPolicy):
    """A scripted policy whose replies become tokens exactly as a model's samples would."""

    def __init__(
        self, task: Task, script: Script, renderer: ChatRenderer, rollout_id: str, *, version: str
    ) -> None:
        super().__init__(self._reply, renderer, SamplingParams(temperature=0.0), rollout_id)
        self.task, self.script, self.version = task, script, version
        self.end = min(stop_token_ids(renderer.tokenizer))
        self._messages: Sequence[Message] = ()

    async def act(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], *, seed: int
    ) -> PolicyOutput:
        self._messages = messages
        return await super().act(messages, tools, seed=seed)

    async def _reply(self, request: SampleRequest) -> tuple[Sample, float]:
        text = self.script(self.task, self._messages)
        calls = OPEN in text
        # A model ends a final answer with its end-of-turn token and stops after a tool call's tag.
        ids = [*self.renderer.encode(text), *(() if calls else (self.end,))]
        return (
            Sample(
                key=request.key,
                token_ids=tuple(ids),
                logprobs=(),
                finish_reason="tool_call" if calls else "stop",
                text=text,
                batch=(request.key,),
                policy_version=self.version,
            ),
            0.0,
        )


def _guess(task: Task, messages: Sequence[Message]) -> str:
    return GUESS


async def collect_demonstrations(
    tasks: Sequence[Task],
    renderer: ChatRenderer,
    *,
    run_id: str,
    seed: int,
    imperfect_fraction: float = 0.0,
    families: Mapping[str, Family] | None = None,
    env_config: EnvConfig | None = None,
    provenance: Provenance | None = None,
    limits: EpisodeLimits | None = None,
) -> list[Trajectory]:
    """One demonstration per task, run in real sandboxes and scored by the family's verifier."""
    rng = random.Random(derive_seed(seed, "imperfect-demos"))
    imperfect = set(rng.sample(range(len(tasks)), round(imperfect_fraction * len(tasks))))
    if families is None:  # the registered families the tasks name, each loaded once
        families = families_named(t.family for t in tasks)
    modules = sorted({m for f in families.values() for m in f.tool_modules})
    out: list[Trajectory] = []
    async with SandboxPool(modules) as sandboxes, VerifierRunner() as verifiers:
        for index, task in enumerate(tasks):
            family = families[task.family]
            script = _guess if index in imperfect else family.oracle
            rollout_id = f"{run_id}/demo/0/{task.id}/0"
            version = f"oracle:{family.name}@{code_fingerprint(script)}"
            policy = DemoPolicy(task, script, renderer, rollout_id, version=version)
            member_seed = derive_seed(seed, "demo", task.id)
            out.append(
                await run_episode(
                    family.env(env_config, seed=derive_seed(member_seed, "env")),
                    task,
                    policy,
                    verifier=family.verifier,
                    cross=family.cross,
                    sandboxes=sandboxes,
                    verifiers=verifiers,
                    ids=EpisodeIds(run_id, rollout_id, f"{run_id}/demo/0/{task.id}", member_seed),
                    limits=limits,
                    provenance=provenance,
                )
            )
    return out
