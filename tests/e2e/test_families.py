"""The built-in families in real sandboxes: oracles solve every eval task, tool-less answers fail."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from reprorl.actions import render_call
from reprorl.envs.sandbox import SandboxPool
from reprorl.orchestrate.run.integrity import trajectory_signature
from reprorl.rewards import VerifierRunner
from reprorl.rollout import FAMILIES, EpisodeIds, ScriptedPolicy, run_episode
from reprorl.types import Message, Split, Task, Termination, ToolOutcome, Trajectory


async def _run_all(name: str, tasks: Sequence[Task], script: Any) -> list[Trajectory]:
    family = FAMILIES[name]
    async with SandboxPool(family.tool_modules) as pool, VerifierRunner() as verifiers:
        return list(
            await asyncio.gather(
                *[
                    run_episode(
                        family.env(seed=i),
                        task,
                        ScriptedPolicy(task, script),
                        verifier=family.verifier,
                        cross=family.cross,
                        sandboxes=pool,
                        verifiers=verifiers,
                        ids=EpisodeIds("fam", f"fam/{name}/{i}", seed=i),
                    )
                    for i, task in enumerate(tasks)
                ]
            )
        )


def _outcome(trajectory: Trajectory) -> float:
    assert trajectory.reward is not None, (trajectory.termination, trajectory.error)
    return trajectory.reward.components["outcome"]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_oracle_scores_one_and_answering_without_tools_scores_zero(name: str) -> None:
    tasks = FAMILIES[name].generate(0)[Split.EVAL].tasks
    solved = asyncio.run(_run_all(name, tasks, FAMILIES[name].oracle))
    assert [_outcome(t) for t in solved] == [1.0] * len(tasks)
    assert all(t.termination == Termination.ANSWERED for t in solved)
    assert all(t.env_version.startswith("sha256:") and t.tool_versions for t in solved)
    # Honest work matches no exploit signature, and every cross verifier confirms it.
    signed = [trajectory_signature(task, t) for task, t in zip(tasks, solved, strict=True)]
    assert signed == [None] * len(tasks)
    crossed = [
        {k: v for k, v in (t.reward.components if t.reward else {}).items() if k.startswith("cross/")}
        for t in solved
    ]
    expected = {f"cross/{type(c).__name__}": 1.0 for c in FAMILIES[name].cross}
    assert crossed == [expected] * len(tasks)
    if name == "calculator":
        assert expected == {"cross/ExpressionAnswer": 1.0}

    def blurt(task: Task, messages: Sequence[Message]) -> str:
        return "42"

    guessed = asyncio.run(_run_all(name, tasks, blurt))
    assert sum(_outcome(t) for t in guessed) / len(tasks) <= 0.05


@pytest.mark.parametrize(
    ("name", "reply", "outcome", "termination"),
    [
        (
            "sql",
            render_call("sql_execute", {"sql": "DROP TABLE products"}),
            ToolOutcome.PERMISSION_DENIED,
            Termination.UNSAFE_ACTION,
        ),
        (
            "sql",
            render_call("sql_execute", {"sql": "DELETE FROM orders"}),
            ToolOutcome.PERMISSION_DENIED,
            Termination.UNSAFE_ACTION,
        ),
        (
            "files",
            render_call("cat", {"path": "../../../etc/passwd"}),
            ToolOutcome.PERMISSION_DENIED,
            Termination.ANSWERED,
        ),
        (
            "calculator",
            render_call("calc", {"expression": "9 ** 9 ** 9"}),
            ToolOutcome.BAD_ARGUMENTS,
            Termination.ANSWERED,
        ),
    ],
)
def test_family_probes_are_refused_and_unpaid(
    name: str, reply: str, outcome: ToolOutcome, termination: Termination
) -> None:
    task = FAMILIES[name].generate(0)[Split.EVAL].tasks[0]

    def probe(task: Task, messages: Sequence[Message]) -> str:
        return reply if len(messages) <= len(task.prompt) + 1 else "done"

    (trajectory,) = asyncio.run(_run_all(name, [task], probe))
    assert trajectory.turns[0].tool_results[0].outcome == outcome
    assert trajectory.termination == termination
    assert _outcome(trajectory) == 0.0
