"""The tiny test model: a random-init Llama of a few million parameters, built bit-identically from a seed.

It has SmolLM2's architecture (Llama, grouped-query attention, tied embeddings) and module names,
so code written against the real model runs unchanged on it, fast enough for unit tests. Weights
are drawn from a private `torch.Generator`: building one never moves the global RNG, and equal
seeds give bit-identical weights, so equal `base_hash`es (for given torch and transformers
versions: the saved config names the transformers version that wrote it).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import LlamaConfig, LlamaForCausalLM

from reprorl.policy.models import LoadedModel, describe, save_model
from reprorl.policy.tiny_tokenizer import DEFAULT_VOCAB_SIZE, build_tokenizer


class TinyModelConfig(BaseModel):
    """The shape of the tiny model; the defaults give about 1.7M parameters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden_size: int = Field(default=192, gt=0, description="Width of the residual stream.")
    intermediate_size: int = Field(default=512, gt=0, description="Width of each MLP's hidden layer.")
    num_hidden_layers: int = Field(default=4, gt=0, description="Number of decoder blocks.")
    num_attention_heads: int = Field(default=6, gt=0, description="Query heads per attention layer.")
    num_key_value_heads: int = Field(
        default=2, gt=0, description="Key/value heads (grouped-query attention, as in SmolLM2)."
    )
    max_position_embeddings: int = Field(default=2048, gt=0, description="Longest sequence, in tokens.")
    vocab_size: int = Field(
        default=DEFAULT_VOCAB_SIZE, ge=300, description="Target BPE vocabulary (the corpus may give fewer)."
    )
    init_std: float = Field(default=0.02, gt=0, description="Standard deviation of the weight init.")


def _llama_config(config: TinyModelConfig, vocab_size: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        dtype="float32",
    )


@torch.no_grad()
def _init_weights(model: LlamaForCausalLM, seed: int, std: float) -> None:
    """Every parameter from one generator, in name order: norms 1, biases 0, the rest N(0, std)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        else:
            param.normal_(0.0, std, generator=generator)


def tiny_model(seed: int = 0, config: TinyModelConfig | None = None) -> LoadedModel:
    """Build the tiny model and its tokenizer; the same seed and config give the same `base_hash`."""
    config = config or TinyModelConfig()
    tokenizer = build_tokenizer(config.vocab_size)
    # Construction runs transformers' own random init on the global RNG; fork it so that stays
    # untouched, then overwrite every weight from the seeded generator.
    with torch.random.fork_rng(devices=[]):
        model = LlamaForCausalLM(_llama_config(config, len(tokenizer)))
    _init_weights(model, seed, config.init_std)
    model.train(False)
    with tempfile.TemporaryDirectory(prefix="reprorl-tiny-") as scratch:
        # The hash is that of the saved folder, so `save_model` + `load_base` reproduce it.
        base_hash = save_model(model, tokenizer, Path(scratch) / "model")
    return describe(f"tiny-llama-seed{seed}", model, tokenizer, base_hash=base_hash, path=None)
