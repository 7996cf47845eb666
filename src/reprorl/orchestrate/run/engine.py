"""Opening a training run's rollout engine (vLLM): its base model folder, its servers, its record.

A run with `model.vllm` samples through vLLM servers. Those reprorl starts serve a folder holding
the run's base model exactly as this process loaded it (written once per run, under the run's
`engine/` folder, beside the adapter folders each version is loaded from); servers given by URL
must serve that same base. What the engine is — vLLM's version, the flags, the servers — is an
event of the run and part of every rollout's sampler record.
"""

from __future__ import annotations

import shutil

from reprorl.config import RunSpec
from reprorl.config.spec import LoraAdapter
from reprorl.errors import UserInputError
from reprorl.orchestrate.run.policies import load_run_base
from reprorl.policy import LoadedModel
from reprorl.policy.models import save_model
from reprorl.policy.vllm_engine import RolloutEngine
from reprorl.store import RunRecord, Store


def check_engine(spec: RunSpec, *, ray: str | None = None) -> None:
    """Refuse a spec the vLLM engine cannot serve, naming the field."""
    engine = spec.model.vllm
    if engine is None:
        return
    if spec.model.adapter.kind != "lora":
        raise UserInputError(
            "model.vllm loads each version as a LoRA adapter; full fine-tuning through vLLM is not "
            "supported: set model.adapter.kind = 'lora' or remove model.vllm",
            field="model.vllm",
        )
    if spec.model.inference is not None:
        raise UserInputError("give model.vllm or model.inference, not both", field="model.vllm")
    if ray is not None:
        raise UserInputError(
            "model.vllm samples from this process's engine; run it without --ray", field="model.vllm"
        )
    needed = spec.learning.pipeline.max_staleness + 2
    if engine.max_loras < needed:
        raise UserInputError(
            f"model.vllm.max_loras = {engine.max_loras} cannot hold the {needed} versions a staleness of "
            f"{spec.learning.pipeline.max_staleness} keeps live; set it to {needed} or more",
            field="model.vllm.max_loras",
        )


def open_engine(store: Store, spec: RunSpec, record: RunRecord, loaded: LoadedModel) -> RolloutEngine | None:
    """The run's started engine, or None without `model.vllm`."""
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
    adapter = spec.model.adapter
    lora_rank = adapter.rank if isinstance(adapter, LoraAdapter) else 8
    engine = RolloutEngine(
        engine_spec,
        model_dir=model_dir,
        dtype=spec.model.sampling_dtype,
        seed=spec.seed,
        lora_rank=lora_rank,
        log_dir=folder / "logs",
        on_event=record.event,
    )
    record.event("engine_starting", servers=len(engine.servers), attached=list(engine_spec.urls))
    engine.start()
    record.event("engine_started", engine=engine.info(), base_folder_hash=base_folder_hash)
    return engine
