"""The env of a verifiers v1 taskset's family: the task's prompt, answered, with the taskset in its version.

A verifiers v1 task is data plus scoring; the agent answers its prompt (the taskset's toolsets are
not offered). The env's version hashes the taskset's code, its config and the `verifiers` package's
version, so a changed taskset is a changed env.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any, ClassVar

from reprorl.envs.base import EnvConfig, ToolEnv
from reprorl.envs.tool import Tool
from reprorl.hashing import code_fingerprint, content_hash


class VerifiersEnv(ToolEnv):
    """Subclassed per family by `verifiers_env`."""

    tools: ClassVar[tuple[Tool, ...]] = ()
    taskset: ClassVar[str] = ""
    taskset_config: ClassVar[dict[str, Any]] = {}

    @classmethod
    def version(cls, config: EnvConfig | None = None) -> str:
        module, _, name = cls.taskset.partition(":")
        taskset_cls = getattr(importlib.import_module(module), name)
        return content_hash(
            {
                "family": cls.family,
                "code": code_fingerprint(*cls.__mro__),
                "taskset": cls.taskset,
                "taskset_code": code_fingerprint(taskset_cls, taskset_cls.task_type()),
                "taskset_config": cls.taskset_config,
                "verifiers": importlib.metadata.version("verifiers"),
                "config": (config or EnvConfig()).as_json(),
            }
        )

    def info(self) -> dict[str, Any]:
        task = self._task
        reference = task.reference if task is not None and isinstance(task.reference, dict) else {}
        return {
            "kind": "verifiers",
            "taskset": self.taskset,
            "verifiers_version": importlib.metadata.version("verifiers"),
            "task_hash": reference.get("hash"),
            "task_key": reference.get("key"),
        }


def verifiers_env(family: str, taskset: str, config: dict[str, Any]) -> type[VerifiersEnv]:
    attributes = {"family": family, "taskset": taskset, "taskset_config": dict(config)}
    made: type[VerifiersEnv] = type(f"Verifiers_{family.replace('-', '_')}", (VerifiersEnv,), attributes)
    return made
