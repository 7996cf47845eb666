"""Environments: tools, single-use episodes, sandboxes, noise, and the built-in families."""

from reprorl.envs.base import EnvConfig, Observation, StepResult, ToolEnv
from reprorl.envs.common import ask_human, generate_splits, last_tool_output, workspace_path
from reprorl.envs.errors import InvalidArguments, OutsideSandbox, UnsafeAction
from reprorl.envs.tool import Tool, tool

__all__ = [
    "EnvConfig",
    "InvalidArguments",
    "Observation",
    "OutsideSandbox",
    "StepResult",
    "Tool",
    "ToolEnv",
    "UnsafeAction",
    "ask_human",
    "generate_splits",
    "last_tool_output",
    "tool",
    "workspace_path",
]
