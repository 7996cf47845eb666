"""reprorl: reinforcement learning for tool-using LLM agents, traceable to the conditions of every result.

The public API is re-exported here; submodules are layers (see docs/architecture.md).
"""

from importlib.metadata import PackageNotFoundError, version

from reprorl.actions import Action, parse_action, render_call
from reprorl.config import (
    ArtifactRef,
    BudgetSpec,
    DataSpec,
    EvaluationSpec,
    FullFineTune,
    KLPenalty,
    LearningSpec,
    LoraAdapter,
    ModelSpec,
    RollbackRule,
    RunSpec,
    load_spec,
    resolve_spec,
    validate_spec,
)
from reprorl.envs import EnvConfig, Tool, ToolEnv, tool
from reprorl.envs.sandbox import SandboxLimits, SandboxPool
from reprorl.errors import (
    ArtifactNotFoundError,
    FloatingReferenceError,
    IntegrityError,
    NotFoundError,
    RecordError,
    RegistryError,
    ReprorlError,
    RunNotFoundError,
    SpecError,
    StoreError,
    UserInputError,
)
from reprorl.hashing import canonical_json, content_hash
from reprorl.orchestrate import create_run
from reprorl.refs import parse_ref
from reprorl.rewards import FinalState, Verifier, VerifierRunner
from reprorl.rollout import FAMILIES, EpisodeIds, EpisodeLimits, ScriptedPolicy, ToolStats, run_episode
from reprorl.store import ArtifactVersion, ContentStore, Registry, RunRecord, Store, find_run
from reprorl.types import (
    Message,
    Permission,
    Reward,
    Role,
    SamplingParams,
    Split,
    Task,
    TaskSet,
    Termination,
    ToolCall,
    ToolOutcome,
    ToolResult,
    Trajectory,
    Turn,
)

try:
    __version__ = version("reprorl")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

__all__ = [
    "FAMILIES",
    "Action",
    "ArtifactNotFoundError",
    "ArtifactRef",
    "ArtifactVersion",
    "BudgetSpec",
    "ContentStore",
    "DataSpec",
    "EnvConfig",
    "EpisodeIds",
    "EpisodeLimits",
    "EvaluationSpec",
    "FinalState",
    "FloatingReferenceError",
    "FullFineTune",
    "IntegrityError",
    "KLPenalty",
    "LearningSpec",
    "LoraAdapter",
    "Message",
    "ModelSpec",
    "NotFoundError",
    "Permission",
    "RecordError",
    "Registry",
    "RegistryError",
    "ReprorlError",
    "Reward",
    "Role",
    "RollbackRule",
    "RunNotFoundError",
    "RunRecord",
    "RunSpec",
    "SamplingParams",
    "SandboxLimits",
    "SandboxPool",
    "ScriptedPolicy",
    "SpecError",
    "Split",
    "Store",
    "StoreError",
    "Task",
    "TaskSet",
    "Termination",
    "Tool",
    "ToolCall",
    "ToolEnv",
    "ToolOutcome",
    "ToolResult",
    "ToolStats",
    "Trajectory",
    "Turn",
    "UserInputError",
    "Verifier",
    "VerifierRunner",
    "__version__",
    "canonical_json",
    "content_hash",
    "create_run",
    "find_run",
    "load_spec",
    "parse_action",
    "parse_ref",
    "render_call",
    "resolve_spec",
    "run_episode",
    "tool",
    "validate_spec",
]
