"""Sampling: turning prompts (token ids) into sampled tokens with their logprobs, one seed per row.

A `Sampler` takes a batch of `SampleRequest`s and returns one `Sample` each. `LocalSampler` decodes
with transformers on this machine: left-padded prefill, a KV cache, and one forward pass per new
token for the whole batch. Every row draws from its own `torch.Generator` seeded by its request,
so the tokens of a row depend on its seed and never on the global RNG.

Floating-point results depend on the batch a row was computed in (padding changes reduction
order; a one-row matmul takes another kernel than a 32-row one). reprorl therefore records each
row's batch — the keys of every request in it, in slot order — and replays a sample by re-running
that batch as it was: same prompts, seeds, parameters, dtype and thread count give the same bits.

Logprobs are those of the sampled token under the temperature-scaled distribution before top-k
and top-p filtering (at temperature 0, under the unscaled one), which is what a trainer computes
when it scores the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from reprorl.actions import CLOSE
from reprorl.policy.models import LoadedModel
from reprorl.types import SamplingParams

FinishReason = Literal["stop", "length", "tool_call"]


@dataclass(frozen=True)
class SampleRequest:
    """One row to sample: the whole context as token ids, its seed and parameters."""

    key: str  # unique within the batch, e.g. "<rollout_id>/<turn>"; recorded so the batch can be rebuilt
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    seed: int


@dataclass(frozen=True)
class Sample:
    """What one row produced, and the batch it was computed in."""

    key: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    text: str
    batch: tuple[str, ...] = ()  # keys of every row of the batch, in slot order
    policy_version: str = ""


class Sampler(Protocol):
    """Anything that samples token ids for a batch of prompts."""

    policy_version: str

    def info(self) -> dict[str, Any]:
        """What a replay must match: kind, dtype, threads, model hash."""
        ...

    def sample(self, requests: Sequence[SampleRequest]) -> list[Sample]: ...


@dataclass
class _Row:
    request: SampleRequest
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishReason | None = None


def stop_token_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """End-of-turn tokens: the tokenizer's EOS and the chat template's turn terminator, if any."""
    ids = {tokenizer.eos_token_id} if isinstance(tokenizer.eos_token_id, int) else set()
    for token in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        found = tokenizer.convert_tokens_to_ids(token)
        if isinstance(found, int) and found != tokenizer.unk_token_id:
            ids.add(found)
    return frozenset(ids)


class LocalSampler:
    """Batched, KV-cached sampling from a transformers model in this process."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        model_hash: str,
        policy_version: str,
        stop_strings: Sequence[str] = (CLOSE,),
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_hash = model_hash
        self.policy_version = policy_version
        self.stop_strings = tuple(stop_strings)
        self.stop_ids = stop_token_ids(tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if isinstance(pad, int) else min(self.stop_ids)
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        # Stop strings are checked only after a token that can complete one (its text holds the
        # stop string's last character): a table lookup instead of a decode per row and step.
        pieces = tokenizer.batch_decode(
            [[i] for i in range(len(tokenizer))], clean_up_tokenization_spaces=False
        )
        tails = {s[-1] for s in self.stop_strings if s}
        self._may_end_stop = [any(t in piece for t in tails) for piece in pieces]
        self._tail_tokens = (
            max((len(tokenizer.encode(s, add_special_tokens=False)) for s in stop_strings), default=1) + 2
        )

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, *, policy_version: str | None = None) -> LocalSampler:
        """A sampler of a loaded base model (or of the adapter already applied to it)."""
        return cls(
            loaded.model,
            loaded.tokenizer,
            model_hash=loaded.base_hash,
            policy_version=policy_version or f"base:{loaded.base_hash}",
        )

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def info(self) -> dict[str, Any]:
        return {
            "kind": "local",
            "model_hash": self.model_hash,
            "dtype": str(self.dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        }

    def sample(self, requests: Sequence[SampleRequest]) -> list[Sample]:
        if not requests:
            return []
        keys = tuple(r.key for r in requests)
        if len(set(keys)) != len(keys):
            raise ValueError("sample requests in one batch need distinct keys")
        rows = [_Row(r, torch.Generator(device="cpu").manual_seed(r.seed)) for r in requests]
        for row in rows:
            if not row.request.prompt_ids:
                raise ValueError(f"request {row.request.key!r} has an empty prompt")
        with torch.inference_mode():
            self._decode(rows)
        return [
            Sample(
                key=row.request.key,
                token_ids=tuple(row.tokens),
                logprobs=tuple(row.logprobs),
                finish_reason=row.finish or "length",
                text=str(
                    self.tokenizer.decode(
                        row.tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False
                    )
                ),
                batch=keys,
                policy_version=self.policy_version,
            )
            for row in rows
        ]

    def _decode(self, rows: list[_Row]) -> None:
        device = next(self.model.parameters()).device
        lengths = [len(r.request.prompt_ids) for r in rows]
        width = max(lengths)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - lengths[i] :] = torch.tensor(row.request.prompt_ids)
            mask[i, width - lengths[i] :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        active = list(range(len(rows)))
        logits = self._forward(ids, mask, positions, cache, device)
        next_pos = positions[:, -1] + 1
        budget = [
            min(r.request.params.max_tokens, self.max_positions - n)
            for r, n in zip(rows, lengths, strict=True)
        ]
        while True:
            chosen = self._choose(logits, [rows[i] for i in active])
            keep: list[int] = []
            for slot, index in enumerate(active):
                row, token = rows[index], chosen[slot]
                if self._record(row, token, budget[index]) is None:
                    keep.append(slot)
            if not keep:
                return
            if len(keep) < len(active):
                cache.batch_select_indices(torch.tensor(keep))
                mask, next_pos = mask[keep], next_pos[keep]
                active = [active[s] for s in keep]
            tokens = torch.tensor([[rows[i].tokens[-1]] for i in active])
            mask = torch.cat([mask, torch.ones((len(active), 1), dtype=torch.long)], dim=1)
            logits = self._forward(tokens, mask, next_pos[:, None], cache, device)
            next_pos = next_pos + 1

    def _forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: DynamicCache,
        device: torch.device,
    ) -> torch.Tensor:
        out = self.model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits: torch.Tensor = out.logits[:, -1, :].float().cpu()
        return logits

    def _choose(self, logits: torch.Tensor, rows: list[_Row]) -> list[tuple[int, float]]:
        """Draw one token per row from its own generator; return (token, logprob) pairs."""
        chosen: list[tuple[int, float]] = []
        groups: dict[tuple[float, int, float], list[int]] = {}
        for slot, row in enumerate(rows):
            p = row.request.params
            groups.setdefault((p.temperature, p.top_k, p.top_p), []).append(slot)
        picks: dict[int, tuple[int, float]] = {}
        for (temperature, top_k, top_p), slots in groups.items():
            block = logits[slots]
            if temperature == 0.0:
                logp = torch.log_softmax(block, dim=-1)
                tokens = block.argmax(dim=-1)
                for j, slot in enumerate(slots):
                    token = int(tokens[j])
                    picks[slot] = (token, float(logp[j, token]))
                continue
            scaled = block / temperature
            logp = torch.log_softmax(scaled, dim=-1)
            probs = torch.softmax(filter_logits(scaled, top_k, top_p), dim=-1)
            for j, slot in enumerate(slots):
                token = int(torch.multinomial(probs[j], 1, generator=rows[slot].generator))
                picks[slot] = (token, float(logp[j, token]))
        for slot in range(len(rows)):
            chosen.append(picks[slot])
        return chosen

    def _record(self, row: _Row, pick: tuple[int, float], budget: int) -> FinishReason | None:
        token, logprob = pick
        row.tokens.append(token)
        row.logprobs.append(logprob)
        if token in self.stop_ids:
            row.finish = "stop"
        elif self._may_end_stop[token] if token < len(self._may_end_stop) else False:
            tail = self.tokenizer.decode(
                row.tokens[-self._tail_tokens :],
                skip_special_tokens=False,
                clean_up_tokenization_spaces=False,
            )
            # `in`, not `endswith`: the token that completes a stop string may carry more text.
            if any(s in tail for s in self.stop_strings):
                row.finish = "tool_call"
        if row.finish is None and len(row.tokens) >= budget:
            row.finish = "length"
        return row.finish


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k and the top-p nucleus to -inf (0 and 1.0 mean off)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        mass = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        # Drop a token when the mass before it already reaches top_p; the first always stays.
        drop = (mass - torch.softmax(ordered, dim=-1)) >= top_p
        ordered = ordered.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, ordered)
    return logits
