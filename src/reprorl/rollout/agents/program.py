"""The agent program of a run, resolved once: what the sandbox runs, what it must import, and its code's hash.

A callable's module is found on the import path (the spec's `path` first), imported once by the
sandbox pool's zygote before any episode, and hashed from its source file; a command is hashed
from its arguments and every argument that names an existing file. The hash goes on every rollout
(`Trajectory.agent`), so an edited agent shows in `diff` like an edited env.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprorl.config.agent import AgentSpec
from reprorl.errors import UserInputError
from reprorl.hashing import HASH_PREFIX

INSIDE = "reprorl.envs.agent_launch"  # light: the zygote imports it beside the tool modules


@dataclass(frozen=True)
class AgentProgram:
    """A run's agent, ready to launch in a sandbox."""

    spec: AgentSpec
    code_hash: str
    modules: tuple[str, ...]  # what the sandbox pool imports for it
    sys_path: tuple[str, ...]

    @property
    def fn_ref(self) -> str:
        return f"{INSIDE}:run_callable" if self.spec.callable else f"{INSIDE}:run_command"

    def kwargs(self, *, base_url: str, api_key: str, model: str, task: dict[str, Any]) -> dict[str, Any]:
        common = {"base_url": base_url, "api_key": api_key, "model": model, "task": task}
        if self.spec.callable:
            return {"ref": self.spec.callable, "output_chars": self.spec.output_chars, **common}
        return {"argv": list(self.spec.command or ()), "output_chars": self.spec.output_chars, **common}

    def info(self) -> dict[str, Any]:
        """What every rollout of the run records of its agent."""
        if self.spec.callable:
            return {"kind": "callable", "ref": self.spec.callable, "code_hash": self.code_hash}
        return {"kind": "command", "argv": list(self.spec.command or ()), "code_hash": self.code_hash}


def resolve_program(spec: AgentSpec) -> AgentProgram:
    """Find and hash the agent; a callable that cannot be found is the spec's error, said in one line."""
    path = tuple(str(Path(p).resolve()) for p in spec.path)
    for folder in reversed(path):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    if spec.callable:
        module = spec.callable.partition(":")[0]
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError) as exc:
            raise UserInputError(f"agent.callable: cannot find module {module!r}: {exc}") from None
        if found is None or not found.origin or not Path(found.origin).is_file():
            raise UserInputError(
                f"agent.callable: no module {module!r} on the import path; add its folder to agent.path"
            )
        digest = hashlib.sha256(Path(found.origin).read_bytes()).hexdigest()
        return AgentProgram(spec, HASH_PREFIX + digest, (INSIDE, module), path)
    hasher = hashlib.sha256()
    for argument in spec.command or ():
        hasher.update(argument.encode() + b"\0")
        candidate = Path(argument)
        if candidate.is_file():
            hasher.update(candidate.read_bytes())
    return AgentProgram(spec, HASH_PREFIX + hasher.hexdigest(), (INSIDE,), path)
