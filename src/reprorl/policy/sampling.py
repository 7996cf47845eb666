"""Sampling: turning prompts (token ids) into sampled tokens with their logprobs, one seed per row.

A `Sampler` takes a batch of `SampleRequest`s and returns one `Sample` each. `LocalSampler` decodes
with transformers on this machine: a prefill (`reprorl.policy.prefill`: the shared prefix once, the
remainders in runs of like length), a KV cache, and one forward pass per new token for the whole
batch. For a plain Llama on the CPU the decode steps skip the module tree: the
same weights, packed once for the batch size into fused q|k|v and gate|up GEMMs, and a KV cache
written in place. Every row draws from its own `torch.Generator` seeded by its request, so the
tokens of a row depend on its seed and never on the global RNG: the generator gives one uniform
number per token the row may produce, and token k is drawn by inverse CDF — the first token whose
cumulative (float64) probability exceeds the k-th uniform times the total.

Floating-point results depend on the batch a row was computed in (padding changes reduction
order; a one-row matmul takes another kernel than a 32-row one). reprorl therefore records each
row's batch — the keys of every request in it, in slot order — and replays a sample by re-running
that batch as it was: same prompts, seeds, parameters, dtype and thread count give the same bits.

Logprobs are those of the sampled token under the temperature-scaled distribution before top-k
and top-p filtering (at temperature 0, under the unscaled one), which is what a trainer computes
when it scores the same tokens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer

from reprorl.actions import CLOSE
from reprorl.policy.draw import choose as choose  # re-exported: bench/sampling.py wraps it to profile
from reprorl.policy.fast_llama import LlamaSteps, PackedLlama, fast_path_applies, packing_key
from reprorl.policy.kept import DEFAULT_KEEP_BYTES, KeptCaches
from reprorl.policy.models import LoadedModel
from reprorl.policy.prefill import Base, plain, prefill
from reprorl.threads import native_thread
from reprorl.types import SamplingParams

FinishReason = Literal["stop", "length", "tool_call"]
# Bumped whenever the same requests could give other bits (draw method, kernels, packing, how the
# prefill splits a batch); a replay compares it with the recorded one before comparing tokens.
SAMPLER_VERSION = 5


@dataclass(frozen=True)
class SampleRequest:
    """One row to sample: the whole context as token ids, its seed and parameters."""

    key: str  # unique within the batch, e.g. "<rollout_id>/<turn>"; recorded so the batch can be rebuilt
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    seed: int
    # The most likely tokens to report at each step with their logprobs (OpenAI's `top_logprobs`);
    # they come from the distribution the token was drawn from and never change what is drawn.
    top_logprobs: int = 0
    # The key of an earlier request whose context this one's extends (an episode's previous turn):
    # where the sampler kept that row's keys and values, the positions the two share are not
    # recomputed (`reprorl.policy.kept`).
    continues: str | None = None
    # Keep this row's keys and values for a later request that `continues` it.
    keep: bool = False


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
    # This row's share of the CPU seconds its batch took, measured by the sampler while the batch
    # had it to itself; None where the sampler does not measure (a remote server).
    cpu_s: float | None = None
    # Per sampled token, the `top_logprobs` most likely (token id, logprob), most likely first.
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()
    # Positions of the prompt whose keys and values were the kept ones of the request it
    # `continues` (not recomputed): its bits depend on that request's batch too.
    reused: int = 0


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
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    base: Base | None = None  # the kept keys and values its prompt starts with


def stop_token_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """End-of-turn tokens: the tokenizer's EOS and the chat template's turn terminator, if any."""
    ids = {tokenizer.eos_token_id} if isinstance(tokenizer.eos_token_id, int) else set()
    for token in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        found = tokenizer.convert_tokens_to_ids(token)
        if isinstance(found, int) and found != tokenizer.unk_token_id:
            ids.add(found)
    return frozenset(ids)


# One batch decodes at a time in a process, whichever sampler it is on, and always on the same
# thread (`native_thread("decode")`, whose OpenMP team is made before memory can run short).
# Concurrent callers (an eval point and the batch sampled ahead of it; batches of two policy
# versions) take turns: a batch never decodes with a packing another batch made for its size, two
# batches never split the torch threads the process was given (a rollout worker granted one CPU
# uses one), and each batch's CPU seconds are its own.
DECODING = threading.Lock()


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
        keep_bytes: int = DEFAULT_KEEP_BYTES,
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
        self._packed: PackedLlama | None = None  # kept between calls: packing costs a few decode steps
        self.kept = KeptCaches(keep_bytes)  # rows' caches an episode's next turn continues from
        native_thread("decode")  # started now, with its thread team, while memory is plentiful

    @classmethod
    def from_loaded(
        cls, loaded: LoadedModel, *, policy_version: str | None = None, keep_bytes: int = DEFAULT_KEEP_BYTES
    ) -> LocalSampler:
        """A sampler of a loaded base model (or of the adapter already applied to it)."""
        return cls(
            loaded.model,
            loaded.tokenizer,
            model_hash=loaded.base_hash,
            policy_version=policy_version or f"base:{loaded.base_hash}",
            keep_bytes=keep_bytes,
        )

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def info(self) -> dict[str, Any]:
        return {
            "kind": "local",
            "version": SAMPLER_VERSION,
            "model_hash": self.model_hash,
            "dtype": str(self.dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "kept_cache_bytes": self.kept.max_bytes,
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
        cpu_s, policy_version = native_thread("decode").call(self._decode_in_turn, rows)
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
                top_logprobs=tuple(row.top),
                policy_version=policy_version,
                cpu_s=cpu_s,
                reused=row.base.length if row.base is not None else 0,
            )
            for row in rows
        ]

    def _decode_in_turn(self, rows: list[_Row]) -> tuple[float, str]:
        """Decode `rows` on the decode thread: CPU seconds per row, and the version of the weights used."""
        with DECODING, torch.inference_mode():
            started = time.process_time()
            self._decode(rows)
            return (time.process_time() - started) / len(rows), self.policy_version

    def _decode(self, rows: list[_Row]) -> None:
        lengths = [len(r.request.prompt_ids) for r in rows]
        # At least one token, as ever, even for a prompt that already fills the context.
        budget = [
            max(1, min(r.request.params.max_tokens, self.max_positions - n))
            for r, n in zip(rows, lengths, strict=True)
        ]
        steps = max(budget)
        # A row's uniforms depend on its own seed and budget only, never on the rest of the batch.
        uniforms = torch.zeros((len(rows), steps), dtype=torch.float64)
        for i, row in enumerate(rows):
            uniforms[i, : budget[i]] = torch.rand(budget[i], generator=row.generator, dtype=torch.float64)
        params = [r.request.params for r in rows]
        want = [r.request.top_logprobs for r in rows]
        cache = DynamicCache(config=self.model.config)
        keeps = plain(cache) and self.kept.max_bytes > 0
        self.kept.drop_other_versions(self.policy_version)
        for row in rows:
            if keeps and row.request.continues is not None:
                row.base = self.kept.take(row.request.continues, row.request.prompt_ids, self.policy_version)
        logits, mask, width = self._prefill(
            [r.request.prompt_ids for r in rows], steps, cache, [r.base for r in rows]
        )
        stepper = self._fast_steps(cache, mask, width) or _HFSteps(self, cache, mask, width)
        slots = list(range(len(rows)))  # slot -> row; a finished row keeps its slot until compaction
        scratch = torch.empty_like(logits)
        for step in range(steps):
            tokens, logprobs, top = choose(
                logits,
                [params[i] for i in slots],
                uniforms[slots, step],
                scratch[: len(slots)],
                max(want[i] for i in slots) if any(want) else 0,
            )
            for slot, (token, logprob) in enumerate(zip(tokens.tolist(), logprobs.tolist(), strict=True)):
                row = rows[slots[slot]]
                if row.finish is None:
                    if top is not None and row.request.top_logprobs:
                        k = row.request.top_logprobs
                        row.top.append(
                            tuple(zip(top[1][slot, :k].tolist(), top[0][slot, :k].tolist(), strict=True))
                        )
                    self._record(row, token, logprob, budget[slots[slot]])
            live = [s for s, i in enumerate(slots) if rows[i].finish is None]
            if not live:
                if keeps:
                    self._keep(rows, slots, stepper, width)
                return
            # Dropping finished rows copies the whole KV cache; carrying them costs a little compute.
            # Rows never mix in a forward pass, so either way the live rows get the same bits.
            if 4 * len(live) <= 3 * len(slots):
                if keeps:
                    self._keep(rows, slots, stepper, width)
                stepper.select(torch.tensor(live))
                slots, tokens = [slots[s] for s in live], tokens[live]
            logits = stepper.step(tokens)

    def _keep(self, rows: list[_Row], slots: list[int], stepper: Steps, width: int) -> None:
        """Keep the caches of the finished rows in `slots` that asked for it and may go on (a reply
        that ended on a stop token ends its episode): the prompt's positions and every sampled
        token's but the last, which no step has computed."""
        keys, values, mask = stepper.kv()
        for slot, index in enumerate(slots):
            row = rows[index]
            if not row.request.keep or row.finish in (None, "stop") or row.request.key in self.kept:
                continue
            columns = torch.cat(
                (mask[slot, :width].nonzero().flatten(), torch.arange(width, width + len(row.tokens) - 1))
            )
            self.kept.put(
                row.request.key,
                (*row.request.prompt_ids, *row.tokens[:-1]),
                [k[slot, :, columns] for k in keys],
                [v[slot, :, columns] for v in values],
                self.policy_version,
            )

    def _prefill(
        self,
        prompts: list[tuple[int, ...]],
        steps: int,
        cache: DynamicCache,
        bases: Sequence[Base | None] = (),
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Fill `cache` with the prompts (`reprorl.policy.prefill`); the last logits, the padding mask
        (room for `steps`), the width."""
        return prefill(self._forward, prompts, steps, cache, self.pad_id, bases)

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        device = next(self.model.parameters()).device
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

    def _fast_steps(self, cache: DynamicCache, mask: torch.Tensor, width: int) -> LlamaSteps | None:
        """Decode steps on packed weights for a plain Llama on the CPU; None for any other model."""
        if not fast_path_applies(self.model):
            return None
        key = packing_key(self.model, mask.shape[0])
        if self._packed is None or self._packed.key != key:
            self._packed = None  # free the old packing before building the new one
            self._packed = PackedLlama(self.model, mask.shape[0], key)
        return LlamaSteps(self.model, self._packed, cache, mask, width)

    def _record(self, row: _Row, token: int, logprob: float, budget: int) -> None:
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


class Steps(Protocol):
    """Decode steps over a filled cache: one forward per new token for the batch's live slots."""

    def step(self, tokens: torch.Tensor) -> torch.Tensor: ...

    def select(self, keep: torch.Tensor) -> None: ...

    def kv(self) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """Per layer the keys and values of every slot (slots x heads x positions x dim), and the mask."""
        ...


class _HFSteps:
    """Decode steps through the model's own forward and a growing cache: any model, any device."""

    def __init__(self, sampler: LocalSampler, cache: DynamicCache, mask: torch.Tensor, width: int) -> None:
        self.sampler, self.cache, self.mask, self.filled = sampler, cache, mask, width
        self.positions = mask[:, :width].sum(-1)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask[:, self.filled] = True
        self.filled += 1
        mask = self.mask[:, : self.filled]
        logits = self.sampler._forward(tokens[:, None], mask, self.positions[:, None], self.cache)
        self.positions = self.positions + 1
        return logits

    def select(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.mask, self.positions = self.mask[keep], self.positions[keep]

    def kv(self) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        layers = [cast(DynamicLayer, layer) for layer in self.cache.layers]
        return (
            [cast(torch.Tensor, x.keys) for x in layers],
            [cast(torch.Tensor, x.values) for x in layers],
            self.mask,
        )
