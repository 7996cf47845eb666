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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Fill `cache` with the prompts; the last logits, the padding mask (room for `steps`), the width."""
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
    if len(runs) == 1 or not all(type(layer) is DynamicLayer for layer in cache.layers):
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
    for layer, k, v in zip(_dynamic(cache), keys, values, strict=True):
        if not layer.is_initialized:  # no shared prefix: nothing was cached yet
            layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
    assert logits is not None
    return logits


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
