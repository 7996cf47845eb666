"""The rollout engine table of a run spec: vLLM servers that sample a training run's rollouts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from reprorl.config.base import SpecModel


class VllmEngine(SpecModel):
    """vLLM's OpenAI-compatible servers sample the rollouts; after each optimizer step the new LoRA
    adapter is loaded into each under a name that is its policy version, and every request names it."""

    urls: tuple[str, ...] = Field(
        default=(),
        description="Servers already running (each serving the run's base model, with LoRA enabled, "
        "runtime LoRA updating allowed and --logprobs-mode processed_logprobs, which a probe checks); "
        "none = reprorl starts `servers` of its own on 127.0.0.1.",
    )
    servers: int = Field(default=1, ge=1, le=64, description="Servers reprorl starts when `urls` is empty.")
    host: Literal["127.0.0.1", "node"] = Field(
        default="127.0.0.1",
        description="Where the servers reprorl starts listen: 127.0.0.1 (their machine only), or, with "
        "--ray, 'node': the address of the Ray node each is placed on, for a cluster of several nodes.",
    )
    gpus_per_server: float = Field(
        default=0.0,
        ge=0.0,
        le=64.0,
        description="GPUs Ray gives each server it places (with --ray; the actor takes no CPU slot).",
    )
    max_loras: int = Field(
        default=4, ge=1, le=64, description="Adapters a server holds at once; at least max_staleness + 2."
    )
    max_model_len: int = Field(default=4096, ge=64, description="Longest prompt + completion, in tokens.")
    batch_invariant: bool = Field(
        default=False,
        description="Start vLLM in its batch-invariant mode (VLLM_BATCH_INVARIANT=1): a request's tokens "
        "do not depend on what else is batched with it, at a cost in speed.",
    )
    memory_fraction: float = Field(
        default=0.3,
        gt=0.0,
        le=1.0,
        description="Share of the device's memory vLLM reserves (--gpu-memory-utilization; on CPU, of RAM).",
    )
    cpu_kv_cache_gib: int = Field(
        default=1, ge=1, le=1024, description="KV cache of a CPU server, GiB (VLLM_CPU_KVCACHE_SPACE)."
    )
    extra_args: tuple[str, ...] = Field(
        default=(), description="More arguments for the servers reprorl starts, as given to vLLM."
    )
    startup_timeout_s: float = Field(
        default=600.0, gt=0.0, le=7200.0, description="How long a server may take to answer /health."
    )
    timeout_s: float = Field(default=300.0, gt=0.0, le=3600.0, description="Per-request timeout, seconds.")
    retries: int = Field(default=3, ge=0, le=20, description="Retries after a connection error, 429 or 5xx.")
