"""A verifiers v1 taskset loaded by its reference: what the env and the reward layers both build from.

`module:Class` names a `vf.Taskset`; it is built with its `TasksetConfig` given as JSON. The
`verifiers` package is imported only when a taskset is loaded.
"""

from __future__ import annotations

import importlib
from typing import Any


def load_taskset(ref: str, config: dict[str, Any]) -> Any:
    """`module:Class` of a verifiers `Taskset`, built with its config."""
    return taskset_class(ref)(_config_type(taskset_class(ref)).model_validate(config))


def taskset_class(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def task_of(loaded: Any, data: Any) -> Any:
    """The taskset's task rebuilt from its data (as JSON), with the taskset's task config."""
    task_type = type(loaded).task_type()
    return task_type(task_type.data_type().model_validate(data), loaded.config.task)


def _config_type(cls: type) -> Any:
    from verifiers.v1 import TasksetConfig
    from verifiers.v1.utils.generic import concrete_type

    return concrete_type(cls, TasksetConfig) or TasksetConfig
