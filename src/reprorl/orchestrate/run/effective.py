"""The effective configuration: what each component a spec field configures actually uses, read from it.

When the loop starts (its rollout runner open), every spec leaf field is read back from the object
that consumes it: sampling parameters and episode limits from the runner, env settings and noise
from the runner's env config, the verifier's time limit from its worker pool, the loss's name and
arguments from the loss object, the adapter's rank and targets from the trained model, the chat
template from the tokenizer, the rollback rules from the guard, and so on. It is written next to
the resolved spec as `runs/<id>/effective.json`; `reprorl runs audit` (question 10) compares the two
field by field, so a field that validates and then does nothing shows as a disagreement. Fields
that are labels for people (`owner`, `name`) are listed in `LABELS` with why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch
from peft import PeftModel

from reprorl.algos import Loss, LossShared, MaskedIS, NoCorrection, TruncatedIS
from reprorl.config import RunSpec
from reprorl.config.judge import JudgeConfig
from reprorl.config.loss import LossConfig
from reprorl.config.spec import LearningSpec
from reprorl.hashing import canonical_json, content_hash
from reprorl.orchestrate.run.budget import BudgetMeter
from reprorl.orchestrate.run.guarding import LoopGuard
from reprorl.orchestrate.run.setup import trained_temperature
from reprorl.orchestrate.run.signal_pool import SignalPool
from reprorl.policy import LoadedModel
from reprorl.policy.digest import text_hash
from reprorl.policy.vllm_engine import RolloutEngine
from reprorl.refs import parse_ref
from reprorl.rollout.runner import BARRIERS, RolloutRunner
from reprorl.store import RunRecord
from reprorl.store.atomic import write_atomic
from reprorl.trainer import LocalTrainer
from reprorl.trainer.ewma import EWMAWeights


class _Suite(Protocol):
    @property
    def ref(self) -> str: ...


class _Source(Protocol):
    name: str

    @property
    def max_staleness(self) -> int: ...


class _Versions(Protocol):
    @property
    def keep_bytes(self) -> int: ...


class _Executor(Protocol):
    @property
    def workers(self) -> int: ...


class TrainLoop(Protocol):
    """What is read of a train loop: the components it built from its spec."""

    @property
    def source(self) -> _Source: ...

    @property
    def executor(self) -> _Executor: ...

    @property
    def versions(self) -> _Versions: ...

    spec: RunSpec
    learning: LearningSpec
    loaded: LoadedModel
    trainer: LocalTrainer
    loss: Loss
    ewma: EWMAWeights | None
    dtype: torch.dtype
    train_version: str
    guard: LoopGuard | None
    pool: SignalPool | None
    budget: BudgetMeter
    engine: RolloutEngine | None

    @property
    def suites(self) -> Sequence[_Suite]: ...


EFFECTIVE_FILE = "effective.json"
FORMAT = "reprorl.effective/1"
LABELS: dict[str, str] = {
    "name": "names the run and its adapter artifact for people; no computation reads it",
    "model.owner": "who answers for the model section; shown by `runs diff`, read by no component",
    "data.owner": "who answers for the data section; shown by `runs diff`, read by no component",
    "learning.owner": "who answers for the learning section; shown by `runs diff`, read by no component",
    "evaluation.owner": "who answers for the evaluation section; shown by `runs diff`, read by no component",
    "agent.owner": "who answers for the agent section; shown by `runs diff`, read by no component",
}
# Fields given as artifact references: the component holds the content hash they are pinned to.
REFERENCES = ("model.base", "model.init_adapter", "model.chat_template", "data.train")
# Fields whose value is a set: order in the spec carries no meaning.
SETS = ("data.tool_permissions", "model.adapter.targets")
CORRECTIONS = {NoCorrection: "none", MaskedIS: "mis", TruncatedIS: "tis"}
# Learning fields the loop reads from its own spec where it uses them (no other component holds them).
READ_BY_LOOP = (
    "deterministic_cuda",  # read by the training job where it sets the trainer's kernels
    "advantage",
    "lr",
    "schedule",
    "warmup_steps",
    "steps",
    "group_size",
    "tasks_per_step",
    "checkpoint_every",
    "keep_checkpoints",
    "drop_zero_variance_groups",
    "sft_steps",
    "sft_lr",
    "sft_schedule",
    "sft_batch_size",
    "sft_imperfect_fraction",
    "sft_demonstrations",
    "sft_temperature",  # read by the warm start, which records it in its sft_done event
    "tool_alarm_steps",
)


def _adapter(loop: TrainLoop) -> dict[str, Any]:
    model = loop.trainer.model
    if not isinstance(model, PeftModel):
        return {"model.adapter.kind": "full"}
    config = model.peft_config["default"]
    return {
        "model.adapter.kind": "lora",
        "model.adapter.rank": int(config.r),
        "model.adapter.alpha": float(config.lora_alpha),
        "model.adapter.dropout": float(config.lora_dropout),
        "model.adapter.targets": sorted(config.target_modules or ()),
    }


def _engine(engine: RolloutEngine | None) -> dict[str, Any]:
    """The vLLM engine's settings as the engine holds them (None: the run sampled in-process)."""
    if engine is None:
        return {"model.vllm": None}
    return {f"model.vllm.{k}": v for k, v in engine.spec.model_dump(mode="json").items()}


def _model(loop: TrainLoop) -> dict[str, Any]:
    tokenizer = loop.loaded.tokenizer
    return {
        "model.base": loop.loaded.base_hash,
        "model.init_adapter": loop.trainer.init_adapter,
        **_adapter(loop),
        "model.inference": None,  # training refuses a remote server (it could not send it weights)
        **_engine(loop.engine),
        "model.sampling_dtype": str(loop.dtype).removeprefix("torch."),
        # Read from what the loop builds each in-process sampler with.
        "model.kept_cache_mib": loop.versions.keep_bytes >> 20,
        # Read from the trainer's autocast, which every forward and backward runs under.
        "model.train_dtype": "bfloat16" if loop.trainer.autocast_bf16 else "float32",
        "model.chat_template": (
            text_hash(tokenizer.chat_template) if loop.spec.model.chat_template is not None else None
        ),
    }


def _data(loop: TrainLoop, runner: RolloutRunner) -> dict[str, Any]:
    env = runner.env_config
    judge = runner.judge
    out: dict[str, Any] = {
        "data.train": loop.train_version,
        "data.tool_output_chars": env.tool_output_chars,
        "data.max_invalid_actions": env.max_invalid_actions,
        "data.tool_permissions": sorted(p.value for p in env.allowed),
        **{f"data.noise.{k}": v for k, v in env.noise.model_dump(mode="json").items()},
        "data.reward_weights": dict(runner.reward_weights or {}),
        # Read where the loop draws each step's tasks (run/rollouts.step_tasks).
        "data.family_weights": loop.spec.data.family_weights,
        # Read where the loop plans each step (TrainLoop.plan), from the pool it opened.
        **({"data.screen": None} if loop.pool is None else {"data.screen.rest_steps": loop.pool.rest_steps}),
        "data.verifier_timeout_s": runner.verifiers.timeout_s,
        "data.judge": None,
    }
    config = getattr(judge, "config", None)
    if isinstance(config, JudgeConfig):
        del out["data.judge"]
        out |= {f"data.judge.{k}": v for k, v in config.model_dump(mode="json").items()}
    return out


def _learning(loop: TrainLoop, runner: RolloutRunner) -> dict[str, Any]:
    loss, learning = loop.loss, loop.learning
    # A loss holds the shared settings itself (the built-ins) or as the `LossShared` it was given.
    holder: Any = (
        getattr(loss, "shared", None) if isinstance(getattr(loss, "shared", None), LossShared) else loss
    )
    correction = getattr(holder, "correction", None)
    barrier = next((name for name, known in BARRIERS.items() if type(runner.barrier) is known), "unknown")
    return {
        **_loss_fields(loss, learning, loop.ewma),
        "learning.kl.coef": getattr(holder, "kl_coef", None),
        "learning.kl.estimator": getattr(holder, "kl_estimator", None) if learning.kl.coef > 0 else "off",
        "learning.kl.monitor_every": learning.kl.monitor_every,  # read by the loop's updates
        "learning.kl.reference": "initial" if loop.trainer.pinned is not None else "base",
        "learning.correction": CORRECTIONS.get(type(correction), "none"),
        "learning.tis_cap": getattr(correction, "cap", learning.tis_cap),
        # The sampler's, where the trainer's logprobs are at the same temperature; else the trainer's,
        # which then disagrees with the spec.
        "learning.temperature": runner.params.temperature
        if loop.trainer.temperature == trained_temperature(runner.params.temperature)
        else loop.trainer.temperature,
        "learning.top_p": runner.params.top_p,
        "learning.top_k": runner.params.top_k,
        "learning.max_tokens": runner.params.max_tokens,
        "learning.max_turns": runner.limits.max_turns,
        "learning.episode_wall_s": runner.limits.wall_s,
        "learning.rollout_concurrency": runner.concurrency,
        "learning.pipeline.lockstep": barrier,
        "learning.pipeline.source": loop.source.name,
        "learning.pipeline.max_staleness": loop.source.max_staleness,
        "learning.pipeline.workers": loop.executor.workers,
        # Read by the loop itself, each where the loop uses it (plan, schedule, checkpoints, mode).
        **{f"learning.{k}": getattr(learning, k) for k in READ_BY_LOOP},
    }


def _loss_fields(loss: Loss, learning: LearningSpec, ewma: EWMAWeights | None) -> dict[str, Any]:
    """The loss table as the built loss holds it: its kind, and each field of its config as the loss
    object carries it (a field it does not carry goes unreported, which the audit calls out); the
    EWMA's decay is the moving average's own."""
    out: dict[str, Any] = {"learning.loss.kind": loss.name}
    config = getattr(loss, "config", None)
    holder: Any = config if isinstance(config, LossConfig) else loss
    for name in learning.loss.model_dump(mode="json"):
        if name != "kind" and hasattr(holder, name):
            out[f"learning.loss.{name}"] = getattr(holder, name)
    if ewma is not None:
        out["learning.loss.ewma_decay"] = ewma.decay
    return out


def _evaluation(loop: TrainLoop) -> dict[str, Any]:
    evaluation = loop.spec.evaluation
    rules = [c.rule.model_dump(mode="json") for c in loop.guard.guard.conditions] if loop.guard else []
    return {
        "evaluation.suites": [suite.ref.partition("@")[2] for suite in loop.suites],
        "evaluation.every_steps": evaluation.every_steps,
        "evaluation.samples_per_task": evaluation.samples_per_task,
        "evaluation.temperature": evaluation.temperature,  # passed by the loop to every eval point
        "evaluation.thresholds": dict(evaluation.thresholds),
        "evaluation.rollback": rules,
        "evaluation.max_unscored_share": evaluation.max_unscored_share,
        "evaluation.allow_leakage": evaluation.allow_leakage,
    }


def _budget(loop: TrainLoop, runner: RolloutRunner) -> dict[str, Any]:
    caps = loop.budget.budget
    return {
        **{f"budget.prices.{k}": v for k, v in runner.prices.model_dump(mode="json").items()},
        "budget.max_usd": caps.max_usd,
        "budget.max_wall_s": caps.max_wall_s,
        "budget.max_tokens": caps.max_tokens,
    }


def _agent(runner: RolloutRunner) -> dict[str, Any]:
    """The agent program as the runner resolved it and the limits its sandboxes were opened with."""
    program = runner.agent
    if program is None:
        return {}  # an unset section is no field (see `RunSpec`'s dump)
    limits = runner.sandboxes.limits
    launch = program.kwargs(base_url="", api_key="", model="", task={})
    return {
        "agent.callable": launch.get("ref"),
        "agent.command": launch.get("argv"),
        "agent.path": list(program.spec.path),
        "agent.cpu_s": limits.cpu_s,
        "agent.memory_bytes": limits.memory_bytes,
        "agent.output_chars": launch["output_chars"],
    }


def effective_config(loop: TrainLoop, runner: RolloutRunner) -> dict[str, Any]:
    """Every configured field, as the component that consumes it holds it (see the module docstring)."""
    return {
        "seed": loop.spec.seed,
        **_model(loop),
        **_data(loop, runner),
        **_learning(loop, runner),
        **_evaluation(loop),
        **_budget(loop, runner),
        **_agent(runner),
    }


def write_effective(record: RunRecord, fields: Mapping[str, Any]) -> str:
    """Write `effective.json` and log its hash (an `effective_config` event); returns the hash."""
    document = {"format": FORMAT, "fields": dict(fields), "labels": LABELS}
    write_atomic(record.path / EFFECTIVE_FILE, (canonical_json(document) + "\n").encode())
    digest = content_hash(document)
    record.event("effective_config", file=EFFECTIVE_FILE, hash=digest, fields=len(fields))
    return digest


def _normal(path: str, value: Any) -> Any:
    if path in REFERENCES and isinstance(value, str):
        parsed = parse_ref(value)
        return f"sha256:{parsed.digest}" if parsed.is_pinned else value
    if path in SETS and isinstance(value, list):
        return sorted(value)
    if path == "evaluation.suites" and isinstance(value, list):
        return [_normal("data.train", ref) for ref in value]
    return value


def spec_fields(spec: RunSpec) -> dict[str, Any]:
    """The spec's leaf fields by dotted path, as JSON values (a table that is None is one field)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        maps = ("data.reward_weights", "data.family_weights", "evaluation.thresholds")
        if isinstance(value, dict) and prefix not in maps:
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else key, item)
        else:
            out[prefix] = _normal(prefix, value)

    walk("", spec.model_dump(mode="json"))
    return out


def disagreements(spec: RunSpec, fields: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """`(field, spec value, effective value)` wherever the two differ, and for every non-label field
    of the spec that no component reported."""
    wanted = spec_fields(spec)
    out: list[tuple[str, Any, Any]] = []
    for path, value in sorted(wanted.items()):
        if path in LABELS:
            continue
        if path not in fields:
            out.append((path, value, "(not reported by any component)"))
        elif canonical_json(_normal(path, fields[path])) != canonical_json(value):
            out.append((path, value, fields[path]))
    return out
