"""What the verifiers adapter's tests share: a docs/verifiers.md block as an importable module whose
family is registered, and a scripted policy's episodes on a family."""

from __future__ import annotations

import asyncio
import importlib
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from reprorl.envs.base import EnvConfig
from reprorl.envs.sandbox import SandboxPool
from reprorl.rewards import VerifierRunner
from reprorl.rollout.episode import EpisodeIds, ScriptedPolicy, run_episode
from reprorl.rollout.families import FAMILIES, register_family
from reprorl.types import Split, Trajectory

DOCS = Path(__file__).resolve().parents[2] / "docs" / "verifiers.md"


def docs_block(marker: str) -> str:
    (code,) = [c for c in re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S) if marker in c]
    return code


@contextmanager
def docs_family(marker: str, module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The block holding `marker`, saved as `module` and imported; its `FAMILY` registered."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / f"{module}.py").write_text(docs_block(marker))
    monkeypatch.syspath_prepend(str(modules))
    monkeypatch.setenv("PYTHONPATH", str(modules))  # the sandbox and the verifier workers import it
    sys.modules.pop(module, None)
    made = register_family(importlib.import_module(module).FAMILY)
    try:
        yield made
    finally:
        FAMILIES.remove(made.name)
        sys.modules.pop(module, None)


def episodes(family: Any, script: Any, count: int) -> list[Trajectory]:
    """One episode of `script` on each of the family's first `count` train tasks."""
    tasks = family.generate(0, train=count, eval=0, holdout=0)[Split.TRAIN].tasks

    async def run() -> list[Trajectory]:
        async with SandboxPool(family.tool_modules) as pool, VerifierRunner() as verifiers:
            return [
                await run_episode(
                    family.env(EnvConfig(), seed=0),
                    task,
                    ScriptedPolicy(task, script),
                    verifier=family.verifier,
                    sandboxes=pool,
                    verifiers=verifiers,
                    ids=EpisodeIds("run", f"run/train/0/{task.id}/0", "g", 1),
                )
                for task in tasks
            ]

    return asyncio.run(run())
