"""The env of a verifiers v1 taskset's family: the task's prompt, its toolsets' tools, its version.

A verifiers v1 task is data, scoring and the toolsets it (and its taskset) declare. The agent
answers the prompt, calling the toolsets' tools, which run as local code in the episode's sandbox
(`vf_toolsets.py`); after each call the env takes the rollout's shared `State` from there, and the
verifier scores with it. The env's version hashes the taskset's code, its config, its tools'
versions and the `verifiers` package's version, so a changed taskset is a changed env.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any, ClassVar

from reprorl.envs.base import EnvConfig, ToolEnv
from reprorl.envs.calls import CallOutcome
from reprorl.envs.sandbox import Sandbox, SandboxError
from reprorl.envs.tool import Tool
from reprorl.hashing import code_fingerprint, content_hash
from reprorl.types import Task, ToolOutcome
from reprorl.verifiers_v1 import taskset_class

TOOLSETS = "reprorl.envs.external.vf_toolsets"
STATE_RECORD_CHARS = 65536


_NOT_RUN = frozenset({ToolOutcome.UNKNOWN_TOOL, ToolOutcome.BAD_ARGUMENTS, ToolOutcome.PERMISSION_DENIED})


class VerifiersEnv(ToolEnv):
    """Subclassed per family by `verifiers_env`."""

    tools: ClassVar[tuple[Tool, ...]] = ()
    taskset: ClassVar[str] = ""
    taskset_config: ClassVar[dict[str, Any]] = {}
    stateful: ClassVar[bool] = False  # the rollout's State has fields of its own, which tools change

    def __init__(self, config: EnvConfig | None = None, *, seed: int = 0) -> None:
        super().__init__(config, seed=seed)
        self._state: str | None = None

    @classmethod
    def version(cls, config: EnvConfig | None = None) -> str:
        taskset_cls = taskset_class(cls.taskset)
        return content_hash(
            {
                "family": cls.family,
                "code": code_fingerprint(*cls.__mro__),
                "taskset": cls.taskset,
                "taskset_code": code_fingerprint(taskset_cls, taskset_cls.task_type()),
                "taskset_config": cls.taskset_config,
                "tools": {t.name: t.version for t in cls.tools},
                "verifiers": importlib.metadata.version("verifiers"),
                "config": (config or EnvConfig()).as_json(),
            }
        )

    async def setup(self, task: Task, sandbox: Sandbox) -> None:
        """Build the task's toolsets in the sandbox (none to build: nothing runs there)."""
        if not self.tools:
            return
        reference = task.reference if isinstance(task.reference, dict) else {}
        setup = {
            "taskset": self.taskset,
            "config": self.taskset_config,
            "data": reference.get("data"),
            "hash": reference.get("hash"),
        }
        result = await sandbox.call(f"{TOOLSETS}:start", {"setup": setup}, timeout_s=self.setup_timeout_s)
        if not result.ok:
            detail = f"{result.error_type}: {result.error}"
            raise SandboxError(f"{self.family}: starting the taskset's toolsets failed: {detail}")

    async def _call(self, call_id: str, name: str, arguments: dict[str, Any]) -> CallOutcome:
        outcome = await super()._call(call_id, name, arguments)
        ran = outcome.result.outcome not in _NOT_RUN
        if self.stateful and ran and self._sandbox is not None:
            # A failed call may have changed the state too; the sandbox may be gone after a crash.
            taken = await self._sandbox.call(f"{TOOLSETS}:state", {}, timeout_s=self.setup_timeout_s)
            if taken.ok and taken.value:
                self._state = taken.value
        return outcome

    @property
    def env_state(self) -> str | None:
        return self._state

    def info(self) -> dict[str, Any]:
        task = self._task
        reference = task.reference if task is not None and isinstance(task.reference, dict) else {}
        return {
            "kind": "verifiers",
            "taskset": self.taskset,
            "verifiers_version": importlib.metadata.version("verifiers"),
            "task_hash": reference.get("hash"),
            "task_key": reference.get("key"),
            "toolsets": sorted({str((t.bound or {}).get("server", "")) for t in self.tools}),
            **self._recorded_state(),
        }

    def _recorded_state(self) -> dict[str, Any]:
        """The rollout's final State as the verifier read it; past a size, its hash alone."""
        if self._state is None:
            return {}
        kept = self._state if len(self._state) <= STATE_RECORD_CHARS else None
        return {"state": kept, "state_hash": content_hash(self._state)}


def verifiers_env(
    family: str, taskset: str, config: dict[str, Any], *, tool_timeout_s: float = 30.0
) -> type[VerifiersEnv]:
    from reprorl.envs.external.vf_toolsets import listed  # imports verifiers and mcp's server

    tools, stateful = listed(taskset, config, timeout_s=tool_timeout_s)
    attributes = {
        "family": family,
        "taskset": taskset,
        "taskset_config": dict(config),
        "tools": tools,
        "stateful": stateful,
    }
    made: type[VerifiersEnv] = type(f"Verifiers_{family.replace('-', '_')}", (VerifiersEnv,), attributes)
    return made
