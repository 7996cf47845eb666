"""Cross verifiers in an episode: each adds its verdict on the same final state as `cross/<class>`, and
nothing it does — disagree, raise, crash — changes the primary reward or ends the episode badly."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass

from reprorl.envs.sandbox import SandboxPool
from reprorl.rewards import FinalState, Verifier, VerifierRunner
from reprorl.rollout import FAMILIES, EpisodeIds, ScriptedPolicy, run_episode
from reprorl.types import Split, Task, Termination, Trajectory


@dataclass(frozen=True)
class Disagrees(Verifier):
    """Fails every final state."""

    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        return {self.name: 0.0, "detail": 1.0}


@dataclass(frozen=True)
class Raises(Verifier):
    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        raise RuntimeError("a bug in the cross verifier")


@dataclass(frozen=True)
class Crashes(Verifier):
    def score(self, task: Task, state: FinalState) -> dict[str, float]:
        os._exit(3)


def _episode(cross: Sequence[Verifier]) -> Trajectory:
    family = FAMILIES["calculator"]
    task = family.generate(0, train=0, eval=1, holdout=0)[Split.EVAL].tasks[0]

    async def go() -> Trajectory:
        async with SandboxPool(family.tool_modules) as pool, VerifierRunner(workers=1) as verifiers:
            return await run_episode(
                family.env(seed=0),
                task,
                ScriptedPolicy(task, family.oracle),
                verifier=family.verifier,
                cross=cross,
                sandboxes=pool,
                verifiers=verifiers,
                ids=EpisodeIds("cross", "cross/0", seed=0),
            )

    return asyncio.run(go())


def test_cross_verdicts_are_recorded_without_weight_and_failures_add_nothing() -> None:
    plain = _episode(())
    assert plain.reward is not None and plain.reward.success
    checked = _episode((*FAMILIES["calculator"].cross, Disagrees(), Raises(), Crashes()))
    assert checked.termination is Termination.ANSWERED and checked.error is None
    assert checked.reward is not None
    # Only the verdict of each cross verifier that scored is kept; its other components are not.
    assert {k: v for k, v in checked.reward.components.items() if k.startswith("cross/")} == {
        "cross/ExpressionAnswer": 1.0,
        "cross/Disagrees": 0.0,
    }
    assert "detail" not in checked.reward.components
    # The total, success and the primary's own components are exactly those of an episode without them.
    assert checked.reward.total == plain.reward.total and checked.reward.success
    assert {k: v for k, v in checked.reward.components.items() if not k.startswith("cross/")} == (
        plain.reward.components
    )
    # The version names the primary, then every cross verifier asked, by class and code hash.
    primary, *others = checked.reward.verifier_version.split("+")
    assert primary == plain.reward.verifier_version == FAMILIES["calculator"].verifier.version
    assert [v.partition("@")[0] for v in others] == [
        "cross/ExpressionAnswer",
        "cross/Disagrees",
        "cross/Raises",
        "cross/Crashes",
    ]
    assert others[1] == f"cross/Disagrees@{Disagrees().version}"
