"""docs/envs.md's worked example is real: it fits in 60 lines and its oracle solves every task."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import Any

from reprorl.envs.sandbox import SandboxPool
from reprorl.rewards import VerifierRunner
from reprorl.rollout import EpisodeIds, ScriptedPolicy, run_episode
from reprorl.types import Split, Termination

DOC = Path(__file__).resolve().parents[2] / "docs" / "envs.md"


def _example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    family = [b for b in blocks if "class TodoEnv" in b]
    assert len(family) == 1, "docs/envs.md lost its worked example"
    return family[0]


def test_example_fits_in_sixty_lines() -> None:
    assert len(_example().strip().splitlines()) <= 60


def test_example_runs_in_real_sandboxes(tmp_path: Path) -> None:
    (tmp_path / "todo_family.py").write_text(_example())
    sys.path.insert(0, str(tmp_path))
    try:
        import todo_family as fam  # type: ignore[import-not-found]

        tasks = fam.generate(0)[Split.EVAL].tasks

        def silent(task: Any, messages: Any) -> str:
            return "I added them."

        async def run(script: Any, name: str) -> list[Any]:
            async with (
                SandboxPool(["todo_family"], sys_path=[tmp_path]) as pool,
                VerifierRunner() as verifiers,
            ):
                return list(
                    await asyncio.gather(
                        *[
                            run_episode(
                                fam.TodoEnv(),
                                task,
                                ScriptedPolicy(task, script, name),
                                verifier=fam.TodoVerifier(),
                                sandboxes=pool,
                                verifiers=verifiers,
                                ids=EpisodeIds("doc", f"doc/{name}/{i}"),
                            )
                            for i, task in enumerate(tasks)
                        ]
                    )
                )

        solved = asyncio.run(run(fam.oracle, "oracle"))
        assert [t.termination for t in solved] == [Termination.ANSWERED] * len(tasks)
        assert all(t.reward is not None and t.reward.components["outcome"] == 1.0 for t in solved)
        assert all(t.sandbox["isolation"] for t in solved)
        lazy = asyncio.run(run(silent, "silent"))
        assert all(t.reward is not None and t.reward.components["outcome"] == 0.0 for t in lazy)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("todo_family", None)
