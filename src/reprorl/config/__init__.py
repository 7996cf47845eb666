"""Run-spec schemas: what a training run is, loaded from TOML and pinned to exact versions."""

from reprorl.config.agent import AgentSpec
from reprorl.config.judge import JUDGES, JudgeConfig
from reprorl.config.load import (
    apply_overrides,
    ensure_resolved,
    is_resolved,
    iter_refs,
    load_spec,
    resolve_spec,
    validate_spec,
)
from reprorl.config.spec import (
    BudgetSpec,
    DataSpec,
    EvaluationSpec,
    FullFineTune,
    KLPenalty,
    LearningSpec,
    LoraAdapter,
    ModelSpec,
    NoiseSpec,
    PipelineSpec,
    PriceTable,
    RemoteInference,
    RollbackRule,
    RunSpec,
)
from reprorl.refs import FLOATING_LABELS, ArtifactRef, ParsedRef, RefError, parse_ref

__all__ = [
    "FLOATING_LABELS",
    "JUDGES",
    "AgentSpec",
    "ArtifactRef",
    "BudgetSpec",
    "DataSpec",
    "EvaluationSpec",
    "FullFineTune",
    "JudgeConfig",
    "KLPenalty",
    "LearningSpec",
    "LoraAdapter",
    "ModelSpec",
    "NoiseSpec",
    "ParsedRef",
    "PipelineSpec",
    "PriceTable",
    "RefError",
    "RemoteInference",
    "RollbackRule",
    "RunSpec",
    "apply_overrides",
    "ensure_resolved",
    "is_resolved",
    "iter_refs",
    "load_spec",
    "parse_ref",
    "resolve_spec",
    "validate_spec",
]
