"""reprorl: reinforcement learning for tool-using LLM agents, traceable to the conditions of every result.

The public API is re-exported here; submodules are layers (see docs/architecture.md).
"""

import os
from importlib.metadata import PackageNotFoundError, version

# MKL's default GEMM kernels may round differently with the alignment of their operands, so the same
# computation could differ between two processes that allocated differently. Strict conditional
# numerical reproducibility removes that (at no measured cost here); it is read at MKL's first call.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")


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
    PriceTable,
    RemoteInference,
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
    InferenceError,
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
from reprorl.sinks import MetricSink, SinkError, SinkObserver, SinkRun, SinkTarget, export_run
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

# Models, samplers, training and jobs need torch; they load on first use so that `import reprorl`
# stays light for tools that only read records.
_LAZY = {
    "load_base": "reprorl.policy",
    "tiny_model": "reprorl.policy",
    "LoadedModel": "reprorl.policy",
    "LocalSampler": "reprorl.policy.sampling",
    "Sample": "reprorl.policy.sampling",
    "SampleRequest": "reprorl.policy.sampling",
    "HttpSampler": "reprorl.policy.http",
    "ChatClient": "reprorl.policy.http",
    "ChatRenderer": "reprorl.policy.chat",
    "ModelPolicy": "reprorl.rollout.model_policy",
    "Lockstep": "reprorl.rollout.model_policy",
    "RolloutRunner": "reprorl.rollout.runner",
    "plan_groups": "reprorl.rollout.runner",
    "collect_demonstrations": "reprorl.rollout.demos",
    "AdamParams": "reprorl.trainer",
    "Datum": "reprorl.trainer",
    "LocalTrainer": "reprorl.trainer",
    "CrossEntropy": "reprorl.algos",
    "GRPOAdvantage": "reprorl.algos",
    "DrGRPOAdvantage": "reprorl.algos",
    "RLOOAdvantage": "reprorl.algos",
    "PPOClip": "reprorl.algos",
    "Reinforce": "reprorl.algos",
    "TruncatedIS": "reprorl.algos",
    "MaskedIS": "reprorl.algos",
    "open_policy": "reprorl.orchestrate.policies",
    "sample_run": "reprorl.orchestrate.sample",
    "train_run": "reprorl.orchestrate.train",
    "sft_warm_start": "reprorl.orchestrate.warm_start",
    "Replayer": "reprorl.orchestrate.replay",
    "replay": "reprorl.orchestrate.replay",
    "evaluate_target": "reprorl.orchestrate.offline_eval",
    "compare_runs": "reprorl.orchestrate.compare",
    "grow_suite": "reprorl.orchestrate.regression",
    "EvalPoint": "reprorl.evaluation.point",
    "check_leakage": "reprorl.evaluation.leakage",
    "LeakageReport": "reprorl.evaluation.leakage",
    "Guard": "reprorl.evaluation.guards",
    "GuardPoint": "reprorl.evaluation.guards",
    "Judge": "reprorl.evaluation.judge",
    "JudgeConfig": "reprorl.config",
    "JudgeReward": "reprorl.config",
    "JudgeScore": "reprorl.evaluation.judge",
    "read_scores": "reprorl.evaluation.judge",
    "write_scores": "reprorl.evaluation.judge",
    "Label": "reprorl.evaluation.labels",
    "import_labels": "reprorl.evaluation.labels",
    "read_labels": "reprorl.evaluation.labels",
    "agreement": "reprorl.evaluation.labels",
    "verifier_errors": "reprorl.evaluation.verifier_errors",
    "VerifierErrors": "reprorl.evaluation.verifier_errors",
    "render_report": "reprorl.report",
    "PROBES": "reprorl.rewards.audit",
    "Probe": "reprorl.rewards.audit",
    "audit_rewards": "reprorl.rollout.reward_audit",
    "VerifierAudit": "reprorl.rollout.reward_audit",
    "audit_judge": "reprorl.orchestrate.judge_audit",
    "JudgeAudit": "reprorl.orchestrate.judge_audit",
    "judge_run": "reprorl.orchestrate.judge_run",
    "JudgedRun": "reprorl.orchestrate.judge_run",
    "impossible_variant": "reprorl.envs.common",
    "screen": "reprorl.orchestrate.screen",
    "ScreenSpec": "reprorl.config.screen",
    "ScreenReport": "reprorl.evaluation.screening",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'reprorl' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


try:
    __version__ = version("reprorl")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

__all__ = [  # the lazily loaded names first, then the eager ones
    *sorted(_LAZY),
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
    "InferenceError",
    "FullFineTune",
    "IntegrityError",
    "KLPenalty",
    "LearningSpec",
    "LoraAdapter",
    "Message",
    "MetricSink",
    "ModelSpec",
    "NotFoundError",
    "PriceTable",
    "Permission",
    "RecordError",
    "Registry",
    "RegistryError",
    "RemoteInference",
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
    "SinkError",
    "SinkObserver",
    "SinkRun",
    "SinkTarget",
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
    "export_run",
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
