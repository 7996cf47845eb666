"""The fast decode step for a plain Llama on the CPU: packed, fused GEMMs and a KV cache written in place.

`LocalSampler` uses it when the model is exactly `LlamaForCausalLM` with plain `nn.Linear`
projections (SmolLM2, the tiny test model, a base with its adapter merged); anything else decodes
through the model's own forward. It computes what the model's modules compute — the same weights,
the model's own norms, rotary embedding and activation — without the module tree: q|k|v and
gate|up fused into one GEMM each, weights packed once per batch size into the layout the GEMM
kernel wants (MKL for float32, oneDNN for bfloat16), the query heads of one key/value head read as
one block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, LlamaForCausalLM


def fast_path_applies(model: Any) -> bool:
    """A plain Llama on the CPU whose projections are all `nn.Linear`."""
    if type(model) is not LlamaForCausalLM or model.device.type != "cpu":
        return False
    if getattr(model.config, "pretraining_tp", 1) != 1:
        return False
    return all(
        type(m) is nn.Linear for layer in model.model.layers for group in _groups(layer) for m in group
    )


def packing_key(model: Any, batch: int) -> tuple[Any, ...]:
    """What a packing was made from: batch size, threads, and each weight's storage and version.

    Any in-place update of a weight (a training step) bumps its version, so a stale packing is
    never used.
    """
    params = list(model.parameters())
    return (batch, torch.get_num_threads(), *((p.data_ptr(), p._version, p.dtype) for p in params))


class _Linear:
    """Linears that read one input, fused along their outputs, with the weight packed for the batch.

    Packing reorders the weight once into the layout the GEMM kernel wants, instead of on every
    call; it is chosen for the batch's starting size, so the kernel depends on the batch alone.
    """

    def __init__(self, linears: Sequence[nn.Linear], batch: int) -> None:
        weights = [m.weight.detach() for m in linears]
        self.weight = torch.cat(weights) if len(weights) > 1 else weights[0]
        biases = [m.bias for m in linears if m.bias is not None]
        self.bias = torch.cat([b.detach() for b in biases]) if len(biases) == len(linears) else None
        self.batch, self.mkl, self.packed = batch, False, None
        if self.weight.dtype == torch.float32 and torch._C.has_mkl:
            self.packed, self.mkl = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, batch), True
        elif self.weight.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, batch)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        if self.mkl:  # at another batch size this falls back to the plain weight by itself
            out: torch.Tensor = torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, self.batch)
        else:
            out = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return out


def _groups(layer: Any) -> tuple[list[nn.Linear], ...]:
    """A decoder layer's projections as fused: q|k|v, o, gate|up, down."""
    attn, mlp = layer.self_attn, layer.mlp
    return (
        [attn.q_proj, attn.k_proj, attn.v_proj],
        [attn.o_proj],
        [mlp.gate_proj, mlp.up_proj],
        [mlp.down_proj],
    )


class PackedLlama:
    """A Llama's projections packed for one batch size, and what they were packed from."""

    def __init__(self, model: Any, batch: int, key: tuple[Any, ...]) -> None:
        # Holding the source tensors keeps their addresses from being reused by new weights.
        self.key, self.sources = key, [p.detach() for p in model.parameters()]
        self.layers = [[_Linear(g, batch) for g in _groups(layer)] for layer in model.model.layers]
        self.head = _Linear([model.lm_head], batch)


class LlamaSteps:
    """Llama decode steps without the module tree: packed GEMMs and a KV cache filled in place."""

    def __init__(
        self, model: Any, packed: PackedLlama, cache: DynamicCache, mask: torch.Tensor, width: int
    ) -> None:
        config = model.config
        self.inner, self.packed, self.mask, self.filled = model.model, packed, mask, width
        self.heads, self.kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.positions = mask[:, :width].sum(-1)
        # The padding mask as the additive bias SDPA turns a boolean mask into, kept up to date in
        # place: one conversion per batch instead of one per layer and step (the same bits).
        dtype = model.lm_head.weight.dtype
        self.bias = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))[:, None, None]
        shape = (mask.shape[0], self.kv_heads, mask.shape[1], self.head_dim)
        self.keys, self.values = [], []
        for layer in cache.layers:
            prefill: Any = layer
            self.keys.append(torch.empty(shape, dtype=prefill.keys.dtype))
            self.values.append(torch.empty(shape, dtype=prefill.values.dtype))
            self.keys[-1][:, :, :width] = prefill.keys
            self.values[-1][:, :, :width] = prefill.values

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        inner, n, heads, dim = self.inner, self.filled, self.heads, self.head_dim
        self.mask[:, n] = True
        self.bias[..., n] = 0.0
        self.filled += 1
        batch, half, k_end = tokens.shape[0], dim // 2, (heads + self.kv_heads) * dim
        bias = self.bias[..., : n + 1]
        h = inner.embed_tokens(tokens)
        cos, sin = inner.rotary_emb(h, self.positions[:, None])
        # rotate_half(x) * sin as swap_halves(x) * signed_sin, the sign folded in once per step:
        # -a * b and a * -b are the same float, so these are the model's own bits in one op fewer.
        signed_sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        for layer, (qkv_proj, o_proj, gate_up_proj, down_proj), keys, values in zip(
            inner.layers, self.packed.layers, self.keys, self.values, strict=True
        ):
            qkv = qkv_proj(layer.input_layernorm(h))
            # Rotary embedding of all query and key heads at once, in the model's own arithmetic.
            qk = qkv[:, :k_end].view(batch, -1, dim)
            qk = qk * cos + qk.view(batch, -1, 2, half).flip(-2).view(batch, -1, dim) * signed_sin
            keys[:, :, n] = qk[:, heads:]
            values[:, :, n] = qkv[:, k_end:].view(batch, self.kv_heads, dim)
            # The query heads of one key/value head as a block of queries: each key/value head is
            # read once per step, not once per query head (what `enable_gqa` does).
            attn = F.scaled_dot_product_attention(
                qk[:, :heads].view(batch, self.kv_heads, -1, dim),
                keys[:, :, : n + 1],
                values[:, :, : n + 1],
                attn_mask=bias,
                scale=layer.self_attn.scaling,
            )
            h.add_(o_proj(attn.reshape(batch, heads * dim)))
            gate, up = gate_up_proj(layer.post_attention_layernorm(h)).chunk(2, dim=-1)
            h.add_(down_proj(layer.mlp.act_fn(gate) * up))
        self.positions = self.positions + 1
        return self.packed.head(inner.norm(h)).float()

    def kv(self) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """Per layer the keys and values of every slot (slots x heads x positions x dim), and the mask."""
        return self.keys, self.values, self.mask

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the slots `keep` (ascending), moved down in place: a kept slot already where it
        belongs is not copied, a moved one only up to the filled columns (indexing copied every
        slot's whole buffer, the columns no step has written included)."""
        moves = [(i, int(j)) for i, j in enumerate(keep.tolist()) if i != j]
        n, rows = self.filled, len(keep)
        for buffer in (*self.keys, *self.values):
            for to, source in moves:  # to < source, and every source is above every earlier target
                buffer[to, :, :n] = buffer[source, :, :n]
        self.keys = [k[:rows] for k in self.keys]
        self.values = [v[:rows] for v in self.values]
        self.mask, self.bias, self.positions = self.mask[keep], self.bias[keep], self.positions[keep]
