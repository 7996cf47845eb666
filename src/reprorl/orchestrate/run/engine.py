"""Opening a training run's rollout engine (vLLM): its base model folder, its servers, its record.

A run with `model.vllm` samples through vLLM servers. Those reprorl starts serve a folder holding
the run's base model exactly as this process loaded it (written once per run, under the run's
`engine/` folder, beside the adapter folders each version is loaded from); servers given by URL
must serve that same base. What the engine is — vLLM's version, the flags, the servers — is an
event of the run and part of every rollout's sampler record.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from reprorl.config import RunSpec
from reprorl.config.spec import LoraAdapter
from reprorl.errors import RecordError, UserInputError
from reprorl.orchestrate.run.policies import load_run_base
from reprorl.policy import LoadedModel
from reprorl.policy.logprob_probe import check_logprobs
from reprorl.policy.models import save_model
from reprorl.policy.vllm_engine import Event, RolloutEngine, adapter_dirname
from reprorl.policy.vllm_server import Launch
from reprorl.store import RunRecord, Store


def check_engine(spec: RunSpec, *, ray: str | None = None) -> None:
    """Refuse a spec the vLLM engine cannot serve (here, or on Ray with `ray`), naming the field."""
    engine = spec.model.vllm
    if engine is None:
        return
    if spec.model.adapter.kind != "lora" and spec.learning.pipeline.max_staleness > 0:
        raise UserInputError(
            "model.vllm with full fine-tuning reloads each server's one set of weights in place, so "
            "no two versions can be sampled at once: set learning.pipeline.max_staleness = 0, or "
            "model.adapter.kind = 'lora'",
            field="learning.pipeline.max_staleness",
        )
    if spec.model.inference is not None:
        raise UserInputError("give model.vllm or model.inference, not both", field="model.vllm")
    if ray is None and (engine.host != "127.0.0.1" or engine.gpus_per_server):
        field = "host" if engine.host != "127.0.0.1" else "gpus_per_server"
        raise UserInputError(
            f"model.vllm.{field} places servers on Ray nodes: run with --ray, or remove it",
            field=f"model.vllm.{field}",
        )
    needed = spec.learning.pipeline.max_staleness + 2
    if spec.model.adapter.kind == "lora" and engine.max_loras < needed:
        raise UserInputError(
            f"model.vllm.max_loras = {engine.max_loras} cannot hold the {needed} versions a staleness of "
            f"{spec.learning.pipeline.max_staleness} keeps live; set it to {needed} or more",
            field="model.vllm.max_loras",
        )


def open_engine(
    store: Store, spec: RunSpec, record: RunRecord, loaded: LoadedModel, *, launch: Launch | None = None
) -> RolloutEngine | None:
    """The run's started engine, or None without `model.vllm`; `launch` places the servers it
    starts (children of this process by default)."""
    engine_spec = spec.model.vllm
    if engine_spec is None:
        return None
    folder = record.path / "engine"
    model_dir = None
    base_folder_hash = None
    if not engine_spec.urls:
        model_dir = folder / "base"
        if not (model_dir / "config.json").exists():
            # A fresh copy of the base: the trainer's own model already carries its adapter layers.
            fresh = load_run_base(store, spec, loaded.base_hash)
            scratch = folder / "base.partial"
            shutil.rmtree(scratch, ignore_errors=True)  # a killed earlier attempt at this very save
            base_folder_hash = save_model(fresh.model, fresh.tokenizer, scratch)
            scratch.rename(model_dir)
            del fresh
    engine = build_engine(spec, model_dir, folder / "logs", on_event=record.event, launch=launch)
    record.event("engine_starting", servers=len(engine.servers), attached=list(engine_spec.urls))
    engine.start()
    try:
        # An attached server may run with vLLM's default raw logprobs; those reprorl starts are asked
        # for processed ones, and the probe confirms what every rollout's record will say.
        check_logprobs(
            engine.probe_logprobs(),
            spec.learning.temperature,
            where=f"a vLLM server of model.vllm ({', '.join(s.url for s in engine.servers)})",
            field="model.vllm.urls" if engine_spec.urls else "model.vllm.extra_args",
        )
    except BaseException:
        engine.close()
        raise
    record.event(
        "engine_started", engine=engine.info(), placed=engine.placement(), base_folder_hash=base_folder_hash
    )
    return engine


def build_engine(
    spec: RunSpec,
    model_dir: Path | None,
    log_dir: Path,
    *,
    on_event: Event | None = None,
    launch: Launch | None = None,
) -> RolloutEngine:
    """The engine `spec.model.vllm` describes, not yet started: servers on `model_dir`, or its URLs."""
    assert spec.model.vllm is not None
    adapter = spec.model.adapter
    return RolloutEngine(
        spec.model.vllm,
        model_dir=model_dir,
        dtype=spec.model.sampling_dtype,
        seed=spec.seed,
        lora_rank=adapter.rank if isinstance(adapter, LoraAdapter) else None,
        log_dir=log_dir,
        on_event=on_event,
        launch=launch,
    )


def replay_engine(spec: RunSpec, record: RunRecord, log_dir: Path) -> RolloutEngine:
    """A started engine for re-asking a finished run's rollouts: the run's own base folder (or its URLs)."""
    if spec.model.vllm is None:
        raise UserInputError(f"run {record.run_id} did not sample through vLLM (no model.vllm)")
    model_dir = None
    if not spec.model.vllm.urls:
        model_dir = record.path / "engine" / "base"
        if not (model_dir / "config.json").exists():
            raise RecordError(f"run {record.run_id} has no engine/base folder to serve its base model from")
    engine = build_engine(spec, model_dir, log_dir)
    engine.start()
    return engine


def adapter_folder(record: RunRecord, version: str) -> Path:
    """Where a run with an engine saved the adapter of `version` for its servers to load."""
    return record.path / "engine" / "adapters" / adapter_dirname(version)
