"""reprorl: reinforcement learning for tool-using LLM agents, traceable to the conditions of every result.

What users write and call is re-exported here, for three stories: write an env family (`family`,
`ToolEnv`, `tool`, `Verifier`, `register_verifier`, `openenv_family` over an OpenEnv server, ...),
write a loss or a judge (`register_loss`, `LossConfig`, `TokenBatch`, `register_judge`, ...), and
run a spec (`load_spec`, `Store`, `train_run`, `AgentSpec` for an agent program behind the proxy,
...). Everything else is internal: submodules are layers (see docs/architecture.md) and may change
between versions.
"""

import os
from typing import TYPE_CHECKING

# MKL's default GEMM kernels may round differently with the alignment of their operands, so the same
# computation could differ between two processes that allocated differently. Strict conditional
# numerical reproducibility removes that (at no measured cost here); it is read at MKL's first call.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
# And with their dynamic adjustment on (MKL's default), MKL and OpenMP may run a call on fewer
# threads than asked when the machine is busy, which changes reduction order: two Ray rollout
# workers beside the trainer on two cores sampled the same batch with logprobs 1e-7 apart in about
# one run of three. Intel's reproducibility conditions ask for both off; they are inherited by every
# process a run starts (Ray workers, servers).
os.environ.setdefault("MKL_DYNAMIC", "FALSE")
os.environ.setdefault("OMP_DYNAMIC", "FALSE")


from reprorl.actions import render_call
from reprorl.config import AgentSpec, RunSpec, load_spec
from reprorl.config.judge import JudgeConfig
from reprorl.config.loss import LossConfig
from reprorl.envs import ToolEnv, generate_splits, tool, workspace_path
from reprorl.envs.errors import InvalidArguments, OutsideSandbox, UnsafeAction
from reprorl.envs.mcp_tools import MCPServerSpec, mcp_tools
from reprorl.envs.sandbox import SandboxPool
from reprorl.envs.sandbox.context import ToolContext
from reprorl.errors import UserInputError
from reprorl.rewards import FinalState, Verifier, VerifierRunner
from reprorl.rewards.registered import register_verifier
from reprorl.rollout import EpisodeIds, Family, ScriptedPolicy, run_episode
from reprorl.rollout.external_families import OpenEnvServerSpec, openenv_family, verifiers_family
from reprorl.rollout.families import family, register_family
from reprorl.store import Store, find_run
from reprorl.types import Message, Permission, Role, Split, Task, TaskSet, Trajectory
from reprorl.version import __version__

# Losses, training and jobs need torch, and judges numpy; they load on first use so that `import
# reprorl` stays light for tools that only read records, and starts no thread (BLAS starts its pool
# on import), which a sandbox needs to enter its own user namespace.
_LAZY = {
    "Judge": "reprorl.evaluation.judge",
    "register_judge": "reprorl.evaluation.judge",
    "register_loss": "reprorl.algos",
    "register_advantage": "reprorl.algos",
    "LossShared": "reprorl.algos",
    "LossOutput": "reprorl.algos",
    "TokenBatch": "reprorl.algos",
    "masked_mean": "reprorl.algos",
    "sequence_mean": "reprorl.algos",
    "sequence_means": "reprorl.algos",
    "train_run": "reprorl.orchestrate.jobs.train",
    "replay": "reprorl.orchestrate.jobs.replay",
    "RolloutStore": "reprorl.store.rollout_query",
    "HttpSampler": "reprorl.policy.http",
    "sequences": "reprorl.trainer.data",
    "export_adapter": "reprorl.orchestrate.jobs.export_adapter",
    "export_bundle": "reprorl.portable",
    "import_bundle": "reprorl.portable",
    "read_bundle": "reprorl.portable",
    "DashboardServer": "reprorl.dashboard",
    "create_dashboard": "reprorl.dashboard",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'reprorl' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # what `__getattr__` loads, as type checkers see it (not `object`)
    from reprorl.algos import (
        LossOutput,
        LossShared,
        TokenBatch,
        masked_mean,
        register_advantage,
        register_loss,
        sequence_mean,
        sequence_means,
    )
    from reprorl.dashboard import DashboardServer, create_dashboard
    from reprorl.evaluation.judge import Judge, register_judge
    from reprorl.orchestrate.jobs.export_adapter import export_adapter
    from reprorl.orchestrate.jobs.replay import replay
    from reprorl.orchestrate.jobs.train import train_run
    from reprorl.policy.http import HttpSampler
    from reprorl.portable import export_bundle, import_bundle, read_bundle
    from reprorl.store.rollout_query import RolloutStore
    from reprorl.trainer.data import sequences

__all__ = [  # noqa: RUF022 -- grouped by the story each name serves
    # Write an env family.
    "Family",
    "FinalState",
    "InvalidArguments",
    "Message",
    "OutsideSandbox",
    "Permission",
    "Role",
    "Split",
    "Task",
    "TaskSet",
    "ToolContext",
    "ToolEnv",
    "UnsafeAction",
    "Verifier",
    "family",
    "register_family",
    # An environment, tools or tasks written for another framework (docs/openenv.md, mcp.md, verifiers.md).
    "OpenEnvServerSpec",
    "openenv_family",
    "MCPServerSpec",
    "mcp_tools",
    "verifiers_family",
    "generate_splits",
    "register_verifier",
    "render_call",
    "tool",
    "workspace_path",
    # Write a loss or a judge.
    "Judge",
    "JudgeConfig",
    "LossConfig",
    "LossOutput",
    "LossShared",
    "TokenBatch",
    "masked_mean",
    "register_advantage",
    "register_judge",
    "register_loss",
    "sequence_mean",
    "sequence_means",
    # Run a spec, and look at what it recorded.
    "AgentSpec",
    "EpisodeIds",
    "HttpSampler",
    "DashboardServer",
    "create_dashboard",
    "RolloutStore",
    "RunSpec",
    "SandboxPool",
    "ScriptedPolicy",
    "Store",
    "Trajectory",
    "UserInputError",
    "VerifierRunner",
    "find_run",
    "load_spec",
    "replay",
    "run_episode",
    "sequences",
    "export_adapter",
    "train_run",
    # Hand a run to another machine (docs/portable.md).
    "export_bundle",
    "import_bundle",
    "read_bundle",
    "__version__",
]
