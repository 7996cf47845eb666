"""Kept caches: a row's keys and values after its turn, so the episode's next turn computes only what it adds.

A multi-turn episode's context grows by appending: turn t+1's prompt is turn t's prompt, its sampled
tokens and the rendered tool results. Recomputing the whole prompt every turn is most of a
multi-turn rollout's cost, so `LocalSampler` keeps the keys and values of a row that asked to be
kept (`SampleRequest.keep`) under its sample key, and a later request that names it
(`SampleRequest.continues`) takes them for the positions the two contexts share: only the rest is
prefilled. An entry is taken once; entries past the memory budget are dropped oldest first, and
every entry of other weights is dropped when the weights change. What is kept and taken depends on
the order of the batches alone, never on timing, and each sample records how many positions it
took (`Sample.reused`), so a replay re-runs the batch those came from first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from reprorl.policy.prefill import Base

# Memory for kept caches by default: SmolLM2-135M holds ~46 KB per position in float32, so 2 GiB keep
# ~46k positions (32 sql episodes of ~1,000 tokens use 32k).
DEFAULT_KEEP_BYTES = 2 << 30


@dataclass(frozen=True)
class Kept:
    """One row's kept cache: the tokens at its positions, their keys and values, and the weights."""

    tokens: tuple[int, ...]
    base: Base
    version: str

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.base.keys, *self.base.values))


class KeptCaches:
    """Rows' caches by sample key: taken once, oldest dropped first past `max_bytes`."""

    def __init__(self, max_bytes: int = DEFAULT_KEEP_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0 (0 keeps nothing)")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Kept] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def put(
        self,
        key: str,
        tokens: Sequence[int],
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        version: str,
    ) -> None:
        """Keep a row's cache (its tensors already its own copies) under its sample key."""
        entry = Kept(tuple(tokens), Base(keys, values), version)
        if entry.nbytes > self.max_bytes:
            return
        self._drop(key)
        self._entries[key] = entry
        self.nbytes += entry.nbytes
        while self.nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def take(self, key: str, prompt: Sequence[int], version: str) -> Base | None:
        """The kept cache of `key` cut to the positions `prompt` shares with it (and at least one
        token short of `prompt`, which must be computed to predict from); None where there is none,
        it holds other weights or shares nothing. Taken: a second call finds nothing."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._drop(key)
        if entry.version != version:
            return None
        n = min(len(entry.tokens), len(prompt) - 1)
        n = next((i for i in range(n) if entry.tokens[i] != prompt[i]), n)
        if n < 1:
            return None
        base = entry.base
        if n == base.length:
            return base
        return Base([k[:, :n] for k in base.keys], [v[:, :n] for v in base.values])

    def drop_other_versions(self, version: str) -> None:
        """Forget every entry computed with weights other than `version`'s."""
        for key in [k for k, e in self._entries.items() if e.version != version]:
            self._drop(key)

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.nbytes -= entry.nbytes
