"""The policy a replay samples from: exactly the weights each recorded turn names, or a refusal.

A turn's `policy_version` says which weights sampled it. `base:<hash>` and a stored adapter artifact
(`adapter_version` on the rollout, as `reprorl sample --adapter` records) open through
`open_policy`, as the original did. A version a training run published (`adapter:<hash of its
tensors>`) is loaded from the run's kept versions into the run's own trainer, rebuilt once from its
spec, and merged into a sampling snapshot the way the run's loop did; the tensors are checked
against the version's hash before anything is sampled. Weights that are gone are a one-line refusal.
"""

from __future__ import annotations

from typing import Any

import torch

from reprorl.config import RunSpec
from reprorl.errors import RecordError, UserInputError
from reprorl.orchestrate.run.kept_versions import kept_tensors
from reprorl.orchestrate.run.policies import (
    DTYPES,
    OpenedPolicy,
    chat_template_text,
    load_run_base,
    open_policy,
)
from reprorl.orchestrate.run.setup import build_trainer
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import LocalSampler
from reprorl.rollout.episode import Provenance
from reprorl.store import RunRecord, Store
from reprorl.trainer import LocalTrainer
from reprorl.trainer.snapshot import SamplingSnapshot
from reprorl.types import Trajectory

TRAINED_KINDS = ("adapter", "weights")


class _KeptPolicy:
    """One run's trainer rebuilt for replay, holding whichever kept version was asked for last."""

    def __init__(self, store: Store, spec: RunSpec, base: str, dtype: str) -> None:
        loaded = load_run_base(store, spec, base)
        self.trainer: LocalTrainer = build_trainer(store, loaded, spec)
        self.snapshot = SamplingSnapshot(self.trainer, DTYPES[dtype])
        self.sampler = LocalSampler(
            self.snapshot.model, loaded.tokenizer, model_hash=loaded.base_hash, policy_version=""
        )
        renderer = ChatRenderer(loaded.tokenizer)
        provenance = Provenance(loaded.base_hash, None, renderer.template_hash, self.sampler.info())
        self.opened = OpenedPolicy(loaded, self.sampler, renderer, provenance)

    @torch.no_grad()
    def at(self, version: str, tensors: dict[str, torch.Tensor]) -> OpenedPolicy:
        params = {n: p for n, p in self.trainer.model.named_parameters() if p.requires_grad}
        if set(params) != set(tensors):
            raise RecordError(
                f"the weights kept for {version} do not fit the run's {type(self.trainer.model).__name__} "
                f"({len(tensors)} tensors for {len(params)} trained parameters)"
            )
        for name, param in params.items():
            param.copy_(tensors[name])
        self.snapshot.refresh()
        self.sampler.policy_version = version
        return self.opened


class ReplayPolicies:
    """Opens (and keeps open) the policies rollouts were sampled from, one per set of conditions."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._opened: dict[tuple[Any, ...], OpenedPolicy] = {}
        self._kept: dict[tuple[Any, ...], _KeptPolicy] = {}

    def for_turn(self, record: RunRecord, spec: RunSpec, target: Trajectory, version: str) -> OpenedPolicy:
        """The policy that sampled a turn of `target` recorded as `version`."""
        info = target.sampler
        dtype, threads = str(info.get("dtype", "float32")), info.get("threads")
        if isinstance(threads, int) and threads != torch.get_num_threads():
            # Reduction order depends on how the work is split; a replay must split it the same way.
            torch.set_num_threads(threads)
        kind = version.partition(":")[0]
        if target.adapter_version is None and kind in TRAINED_KINDS:
            return self._trained(record, spec, target, version, dtype)
        if target.adapter_version is None and kind != "base":
            raise UserInputError(
                f"rollout {target.rollout_id!r} names no weights that can be opened ({version!r})"
            )
        key = (target.base_model_hash, target.adapter_version, dtype, threads)
        if key not in self._opened:
            self._opened[key] = open_policy(
                self.store,
                target.base_model_hash,
                adapter=target.adapter_version,
                dtype=dtype,
                threads=threads if isinstance(threads, int) else None,
                chat_template=chat_template_text(self.store, spec),
            )
        opened = self._opened[key]
        if opened.sampler.policy_version != version:
            raise RecordError(
                f"rollout {target.rollout_id!r} was sampled from {version}, but its recorded base and "
                f"adapter open as {opened.sampler.policy_version}"
            )
        return opened

    def _trained(
        self, record: RunRecord, spec: RunSpec, target: Trajectory, version: str, dtype: str
    ) -> OpenedPolicy:
        key = (record.run_id, target.base_model_hash, dtype)
        kept = self._kept.get(key)
        if kept is not None and kept.opened.sampler.policy_version == version:
            return kept.opened
        tensors = kept_tensors(record, version)  # refuses before anything heavy is built
        if kept is None:
            kept = self._kept[key] = _KeptPolicy(self.store, spec, target.base_model_hash, dtype)
        return kept.at(version, tensors)
