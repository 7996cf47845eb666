"""Prefill: a batch's prompts into one KV cache, shared prefix once, remainders in runs of like length.

Prompts of one batch share a long prefix (system prompt, tool schemas) and the members of a group
share all of theirs on the first turn: the shared prefix is computed once, each distinct remainder
once, and the cache and logits are copied out to the rows that repeat them. The remainders of a
multi-turn batch differ widely in length (a first turn's task beside a third turn's whole
exchange: 23 to 324 tokens in one sql batch), and left-padding them all to the longest ran twice
the positions they hold; so remainders are computed in runs of like length, each padded only to
its own longest, and their caches laid side by side, right-aligned, in one cache as wide as the
longest remainder (the mask has a hole between the prefix and each row's remainder; positions skip
it). Which rows share a prefix, a remainder or a run is a function of the batch alone, so re-running
a batch gives the same bits.

A row may also come with a *base*: the keys and values of its context's first positions, kept from
the turn before (`reprorl.policy.kept`). Only its remainder is computed, in runs of like length as
above, each run's bases laid right-aligned before it; such a row's bits depend on its batch and on
the batch its base was computed in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

# A prefix shorter than this is recomputed per row: a separate pass would cost more than it saves.
MIN_SHARED_PREFIX = 16
# A remainder joins the run of the longest one still open while padding it to that one's length
# costs at most this share of the run's width, or at most RUN_SLACK positions: either way the
# padding a run computes stays a fraction of its tokens, and short remainders share one pass.
RUN_RATIO = 0.8
RUN_SLACK = 32

# Logits at the last position for `ids` (rows x positions) under `mask`, at `positions`, with the
# keys and values appended to `cache`.
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache], torch.Tensor]


@dataclass(frozen=True)
class Base:
    """A row's first `length` positions as keys and values, per layer ([kv heads, length, head dim])."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[1])


def shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix every prompt starts with."""
    first, n = prompts[0], min(len(p) for p in prompts)
    for p in prompts[1:]:
        n = next((i for i in range(n) if p[i] != first[i]), n)
    return n


def length_runs(lengths: Sequence[int]) -> list[list[int]]:
    """Indices of `lengths` in runs of like length, longest first (ties in index order)."""
    runs: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if runs:
            longest = lengths[runs[-1][0]]
            if lengths[i] >= RUN_RATIO * longest or longest - lengths[i] <= RUN_SLACK:
                runs[-1].append(i)
                continue
        runs.append([i])
    return runs


def prefill(
    forward: Forward,
    prompts: Sequence[tuple[int, ...]],
    steps: int,
    cache: DynamicCache,
    pad_id: int,
    bases: Sequence[Base | None] = (),
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Fill `cache` with the prompts; the last logits, the padding mask (room for `steps`), the width.

    `bases`: per row, the keys and values of its first positions, or None; rows with one compute
    only the rest of their prompt (only into a cache of plain `DynamicLayer`s; `plain` says)."""
    if any(b is not None for b in bases):
        return _with_bases(forward, prompts, steps, cache, pad_id, bases)
    lengths = [len(p) for p in prompts]
    shared = shared_prefix(prompts) if len(prompts) > 1 else 0
    shared = min(shared, min(lengths) - 1)  # every row keeps a token of its own to predict from
    if shared < MIN_SHARED_PREFIX:
        shared = 0
    distinct: dict[tuple[int, ...], int] = {}
    of_row = [distinct.setdefault(p[shared:], len(distinct)) for p in prompts]
    tails = list(distinct)
    rest = max(len(t) for t in tails)
    width = shared + rest
    ids = torch.full((len(tails), rest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(tails), width + steps), dtype=torch.bool)
    mask[:, :shared] = True
    for i, tail in enumerate(tails):
        ids[i, rest - len(tail) :] = torch.tensor(tail)
        mask[i, width - len(tail) : width] = True
    if shared:
        head = torch.tensor(prompts[0][:shared])[None]
        forward(head, mask[:1, :shared], torch.arange(shared)[None], cache)
    positions = (mask[:, :width].long().cumsum(-1) - 1).clamp(min=0)[:, shared:]
    runs = length_runs([len(t) for t in tails])
    if len(runs) == 1 or not plain(cache):
        if shared:
            cache.batch_repeat_interleave(len(tails))
        logits = forward(ids, mask[:, :width], positions, cache)
    else:
        logits = _in_runs(forward, runs, ids, mask[:, :width], positions, shared, cache)
    if len(tails) < len(prompts):
        index = torch.tensor(of_row)
        cache.batch_select_indices(index)
        logits, mask = logits[index], mask[index]
    return logits, mask, width


def _in_runs(
    forward: Forward,
    runs: list[list[int]],
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    shared: int,
    cache: DynamicCache,
) -> torch.Tensor:
    """The remainders' pass, one run at a time, each cut to its own width; `cache` then holds every
    row's keys and values, each remainder right-aligned where the whole batch's padding puts it."""
    rows, rest = ids.shape
    width = shared + rest
    prefix = [_kv(layer) for layer in _dynamic(cache)] if shared else []
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    logits: torch.Tensor | None = None
    for run in runs:
        index = torch.tensor(run)
        own = int(mask[index, shared:].sum(-1).max())  # the run's longest remainder
        part = DynamicCache() if not prefix else _repeated(prefix, len(run))
        run_mask = torch.cat((mask[index, :shared], mask[index, width - own :]), dim=-1)
        out = forward(ids[index, rest - own :], run_mask, positions[index, rest - own :], part)
        if logits is None:
            logits = out.new_empty((rows, out.shape[-1]))
            for pk, pv in map(_kv, _dynamic(part)):
                keys.append(pk.new_zeros((rows, pk.shape[1], width, pk.shape[-1])))
                values.append(pv.new_zeros((rows, pv.shape[1], width, pv.shape[-1])))
        logits[index] = out
        for (pk, pv), k, v in zip(map(_kv, _dynamic(part)), keys, values, strict=True):
            k[index, :, width - own :] = pk[:, :, -own:]
            v[index, :, width - own :] = pv[:, :, -own:]
    for (pk, pv), k, v in zip(prefix, keys, values, strict=False):
        k[:, :, :shared] = pk
        v[:, :, :shared] = pv
    _install(cache, keys, values)
    assert logits is not None
    return logits


def _install(cache: DynamicCache, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    """Make `cache` hold `keys` and `values` (one per layer), replacing whatever it held."""
    for index, (k, v) in enumerate(zip(keys, values, strict=True)):
        if index >= len(cache.layers):  # a cache made without a config grows its layers on use
            cache.update(k, v, index)
            continue
        layer = cast(DynamicLayer, cache.layers[index])
        if not layer.is_initialized:  # nothing was cached yet (no shared prefix)
            layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v


def _repeated(prefix: list[tuple[torch.Tensor, torch.Tensor]], rows: int) -> DynamicCache:
    """A cache holding the shared prefix's keys and values once per row."""
    part = DynamicCache()
    for index, (k, v) in enumerate(prefix):
        part.update(k.expand(rows, *k.shape[1:]), v.expand(rows, *v.shape[1:]), index)
    return part


def _dynamic(cache: DynamicCache) -> list[DynamicLayer]:
    """The cache's layers, which `prefill` checked are all plain `DynamicLayer`s."""
    return [cast(DynamicLayer, layer) for layer in cache.layers]


def _kv(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """A filled layer's keys and values."""
    assert layer.keys is not None and layer.values is not None
    return layer.keys, layer.values


def plain(cache: DynamicCache) -> bool:
    """Whether every layer of `cache` is a plain `DynamicLayer` (which rows with a base need)."""
    return all(type(layer) is DynamicLayer for layer in cache.layers)


@dataclass(frozen=True)
class _Part:
    """Some rows of a batch prefilled together: their last logits, keys and values per layer (rows x
    heads x positions x dim) and padding mask, all as wide as the part."""

    rows: list[int]
    logits: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    mask: torch.Tensor


def _with_bases(
    forward: Forward,
    prompts: Sequence[tuple[int, ...]],
    steps: int,
    cache: DynamicCache,
    pad_id: int,
    bases: Sequence[Base | None],
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """`prefill` of a batch where some rows extend a base: the others as ever, these in runs of like
    remainder; then every row right-aligned in one cache."""
    fresh = [i for i, b in enumerate(bases) if b is None]
    based = [(i, b) for i, b in enumerate(bases) if b is not None]
    parts = [_fresh(forward, fresh, [prompts[i] for i in fresh], pad_id)] if fresh else []
    for run in length_runs([len(prompts[i]) - b.length for i, b in based]):
        rows = [based[j] for j in run]
        parts.append(_run_on_bases(forward, rows, [prompts[i] for i, _ in rows], pad_id))
    width, total = max(int(part.mask.shape[1]) for part in parts), len(prompts)
    first = parts[0]
    mask = torch.zeros((total, width + steps), dtype=torch.bool)
    logits = first.logits.new_empty((total, first.logits.shape[-1]))
    keys = [k.new_zeros((total, k.shape[1], width, k.shape[-1])) for k in first.keys]
    values = [v.new_zeros((total, v.shape[1], width, v.shape[-1])) for v in first.values]
    for part in parts:
        index, w = torch.tensor(part.rows), int(part.mask.shape[1])
        logits[index] = part.logits
        mask[index, width - w : width] = part.mask
        for k, v, k_out, v_out in zip(part.keys, part.values, keys, values, strict=True):
            k_out[index, :, width - w :] = k
            v_out[index, :, width - w :] = v
    _install(cache, keys, values)
    return logits, mask, width


def _fresh(forward: Forward, rows: list[int], prompts: list[tuple[int, ...]], pad_id: int) -> _Part:
    """The rows without a base, prefilled as a batch of their own."""
    own = DynamicCache()
    logits, mask, width = prefill(forward, prompts, 0, own, pad_id)
    keys, values = zip(*map(_kv, _dynamic(own)), strict=True)
    return _Part(rows, logits, list(keys), list(values), mask[:, :width])


def _run_on_bases(
    forward: Forward, rows: list[tuple[int, Base]], prompts: list[tuple[int, ...]], pad_id: int
) -> _Part:
    """One run of rows with bases: each base right-aligned before its remainder, the remainders
    left-padded to the run's longest and computed in one pass."""
    bases = [b for _, b in rows]
    longest_base = max(b.length for b in bases)
    rests = [p[b.length :] for p, b in zip(prompts, bases, strict=True)]
    rest = max(len(r) for r in rests)
    ids = torch.full((len(rows), rest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), longest_base + rest), dtype=torch.bool)
    part = DynamicCache()
    for layer in range(len(bases[0].keys)):
        k0 = bases[0].keys[layer]
        keys = k0.new_zeros((len(rows), k0.shape[0], longest_base, k0.shape[-1]))
        values = torch.zeros_like(keys)
        for j, base in enumerate(bases):
            keys[j, :, longest_base - base.length :] = base.keys[layer]
            values[j, :, longest_base - base.length :] = base.values[layer]
        part.update(keys, values, layer)
    for j, (base, tail) in enumerate(zip(bases, rests, strict=True)):
        ids[j, rest - len(tail) :] = torch.tensor(tail)
        mask[j, longest_base - base.length : longest_base] = True
        mask[j, longest_base + rest - len(tail) :] = True
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, longest_base:]
    logits = forward(ids, mask, positions, part)
    keys_out, values_out = zip(*map(_kv, _dynamic(part)), strict=True)
    return _Part([i for i, _ in rows], logits, list(keys_out), list(values_out), mask)
