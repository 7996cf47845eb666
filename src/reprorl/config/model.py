"""The model decision of a run spec: which weights the run starts from, which it trains, and what samples."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from reprorl.config.base import Owner, SpecModel
from reprorl.config.engine import VllmEngine
from reprorl.refs import ArtifactRef

# A compute precision; "auto" is what `reprorl.hardware.auto_dtype` picks on the machine that resolves
# the spec.
Precision = Literal["auto", "float32", "bfloat16"]
# The fields that hold one, pinned from "auto" by `resolve_spec`.
PRECISION_FIELDS = ("sampling_dtype", "train_dtype")


class LoraAdapter(SpecModel):
    """Train a LoRA adapter on top of the frozen base weights."""

    kind: Literal["lora"] = "lora"
    rank: int = Field(default=16, ge=1, le=1024, description="LoRA rank r.")
    alpha: float = Field(default=32.0, gt=0, description="LoRA scaling numerator (scale = alpha/r).")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    targets: tuple[str, ...] = Field(
        default=("q_proj", "k_proj", "v_proj", "o_proj"),
        min_length=1,
        description="Module names that receive adapters.",
    )


class FullFineTune(SpecModel):
    """Train every weight of the base model."""

    kind: Literal["full"] = "full"


def _adapter_kind(value: Any) -> str:
    # A table without `kind` is a LoRA adapter, so `model.adapter.rank=4` works on its own.
    kind = value.get("kind", "lora") if isinstance(value, dict) else getattr(value, "kind", "lora")
    return str(kind)


class RemoteInference(SpecModel):
    """An OpenAI-compatible server that samples for the run (vLLM, SGLang, `reprorl serve policy`)."""

    url: str = Field(
        pattern=r"^https?://", description="Base URL of the server's API, e.g. 'http://127.0.0.1:8000/v1'."
    )
    model: str = Field(min_length=1, description="Model name the server serves (as in its /v1/models).")
    timeout_s: float = Field(default=120.0, gt=0.0, le=3600.0, description="Per-request timeout, seconds.")
    retries: int = Field(default=3, ge=0, le=20, description="Retries after a connection error, 429 or 5xx.")


class ModelSpec(SpecModel):
    """Which weights the run starts from and which of them it trains."""

    owner: Owner
    base: ArtifactRef = Field(description="Base model artifact, e.g. 'smollm2-135m@sha256:<hash>'.")
    init_adapter: ArtifactRef | None = Field(
        default=None, description="Adapter to start from (e.g. an SFT warm start); none = fresh."
    )
    adapter: Annotated[
        Annotated[LoraAdapter, Tag("lora")] | Annotated[FullFineTune, Tag("full")],
        Discriminator(
            _adapter_kind,
            custom_error_type="adapter_kind",
            custom_error_message="adapter kind must be 'lora' or 'full'",
        ),
    ] = Field(default_factory=LoraAdapter, description="What is trained; `kind` defaults to 'lora'.")
    inference: RemoteInference | None = Field(
        default=None,
        description="Sample through this server instead of in this process; its batches are not "
        "recorded, so its rollouts cannot be replayed bit for bit.",
    )
    vllm: VllmEngine | None = Field(
        default=None,
        description="Sample the run's rollouts with vLLM instead of in this process (LoRA only); "
        "see docs/scaling.md.",
    )
    sampling_dtype: Precision = Field(
        default="float32",
        description="Precision the local sampler runs in; the trainer's importance weights correct its "
        "mismatch with the trainer's. 'auto': bfloat16 on CUDA and on CPUs with AMX, float32 on other "
        "CPUs (where bfloat16 matmuls run at about half the float32 rate); pinned when the spec is "
        "resolved, so spec.json holds what ran.",
    )
    train_dtype: Precision = Field(
        default="bfloat16",
        description="Precision the trainer's forwards and backwards compute in (autocast; weights and "
        "optimizer state stay float32). 'auto' picks as for sampling_dtype, and is pinned the same way.",
    )
    kept_cache_mib: int = Field(
        default=2048,
        ge=0,
        le=1 << 20,
        description="Memory the local sampler keeps an episode's keys and values in between its turns, so "
        "a next turn computes only what it adds (the tool results) instead of its whole context; oldest "
        "dropped first beyond it. 0 recomputes every context. Each turn records how much it took. "
        "With model.vllm the servers keep their own prefix cache and this applies to nothing.",
    )
    chat_template: ArtifactRef | None = Field(
        default=None, description="Override of the model's own chat template; none = its own."
    )
