"""Policy versions on the rollout side: the weights after each update, as samplers, kept while needed.

Version `v` is the trained state after `v` updates (version 0: the weights RL starts from). The
trainer publishes a version between updates, when its weights hold still; the rollout side then
samples from a plain copy with the adapter merged in (`SamplingSnapshot`), one copy per live version,
so batches drawn from different versions can be in flight at once while the trainer moves on. A
version also keeps its trained tensors (a LoRA adapter's are small): they are what a checkpoint
stores for batches still to be sampled from it, and what a remote worker would receive.

Copies are recycled: a version nothing will sample from again gives its copy back, so memory is
bounded by the staleness bound, not by the run's length. With a rollout engine (vLLM) there are no
copies here: a version is its adapter saved as a folder and loaded into the engine's servers under
the version's name, and retiring it unloads it there. Fully fine-tuned weights are saved as a model
folder the servers reload in place; a server holds one set, so such a run samples synchronously, and
only the folder of the version served now is kept.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from reprorl.orchestrate.run.kept_versions import VersionKeeper
from reprorl.policy import LoadedModel, tensors_hash
from reprorl.policy.digest import tree_hash
from reprorl.policy.kept import DEFAULT_KEEP_BYTES
from reprorl.policy.sampling import LocalSampler, Sampler
from reprorl.policy.vllm_engine import RolloutEngine, adapter_dirname
from reprorl.rollout.episode import Provenance
from reprorl.trainer import LocalTrainer
from reprorl.trainer.snapshot import SamplingSnapshot


@dataclass
class _Copy:
    snapshot: SamplingSnapshot
    sampler: LocalSampler


@dataclass
class PolicyVersion:
    """One published version: its index, its hash, its trained tensors and a sampler of it."""

    index: int
    version: str  # "adapter:<sha256>" or "weights:<sha256>", as rollouts record it
    tensors: dict[str, torch.Tensor]
    sampler: Sampler
    provenance: Provenance
    users: int = 0  # batches sampling from it now
    _copy: _Copy | None = None


def trained_version(trainer: LocalTrainer, tensors: dict[str, torch.Tensor] | None = None) -> str:
    """The version string of trained tensors (the trainer's current ones by default)."""
    kind = "adapter" if trainer.trains_adapter else "weights"
    return f"{kind}:{tensors_hash(tensors if tensors is not None else trainer.trainable_state())}"


def _save_once(trainer: LocalTrainer, folder: Path) -> None:
    """What the trainer trained, saved as `folder` (atomically: a killed save leaves no folder)."""
    if folder.exists():
        return
    scratch = folder.with_name(folder.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    trainer.save_adapter(scratch)
    scratch.rename(folder)


@contextmanager
def holding(trainer: LocalTrainer, tensors: dict[str, torch.Tensor]) -> Iterator[None]:
    """The trainer's model with `tensors` in place of its trained ones, put back afterwards."""
    params = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    kept = {n: p.detach().clone() for n, p in params.items()}
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(tensors[name])
    try:
        yield
    finally:
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(kept[name])


class PolicyVersions:
    """The live versions of one run and the sampling copies they use."""

    def __init__(
        self,
        trainer: LocalTrainer,
        loaded: LoadedModel,
        dtype: torch.dtype,
        template_hash: str,
        *,
        keeper: VersionKeeper | None = None,
        overlap: bool = True,
        engine: RolloutEngine | None = None,
        engine_dir: Path | None = None,
        keep_bytes: int = DEFAULT_KEEP_BYTES,
    ) -> None:
        """`template_hash`: the chat template's, which every trajectory records with its sampler;
        `keeper`: where the run keeps each published version's tensors (None on a remote worker);
        `overlap`: whether sampling goes on while the trainer updates (a staleness bound above 0).
        Without it a trained model that could serve itself (full fine-tuning in the sampling dtype)
        is its own sampling copy, as no batch reads it mid-update. `engine`: vLLM servers that sample
        instead of copies here, each version's adapter saved under `engine_dir` for them to load.
        `keep_bytes`: each copy's sampler's memory for kept caches (`model.kept_cache_mib`)."""
        self.trainer, self.loaded, self.dtype, self.template_hash = trainer, loaded, dtype, template_hash
        self.overlap = overlap
        self.keeper = keeper
        self.live: dict[int, PolicyVersion] = {}
        self._ready: dict[int, asyncio.Event] = {}
        self._spare: list[_Copy] = []
        self.copies_made = 0
        self.engine, self.engine_dir = engine, engine_dir
        self.keep_bytes = keep_bytes

    def publish(self, index: int, tensors: dict[str, torch.Tensor] | None = None) -> PolicyVersion:
        """Make version `index` samplable: from the trainer's weights now, or from saved `tensors`.

        Call it only while the trainer is between updates. Publishing an index again (the weights
        were reverted) rewrites that version in place; it must not be in use.
        """
        if tensors is not None:
            with holding(self.trainer, tensors):
                return self.publish(index)
        current = self.live.get(index)
        if current is not None and current.users:
            raise RuntimeError(f"policy version {index} is being sampled from and cannot change")
        if self.engine is not None:
            return self._publish_to_engine(index, self.engine)
        copy = current._copy if current is not None and current._copy else self._take_copy()
        copy.snapshot.refresh()
        tensors = {n: t.detach().clone() for n, t in self.trainer.trainable_state().items()}
        version = trained_version(self.trainer, tensors)
        if self.keeper is not None:
            self.keeper.keep(version, tensors, step=index)
        copy.sampler.policy_version = version
        provenance = Provenance(self.loaded.base_hash, None, self.template_hash, copy.sampler.info())
        published = PolicyVersion(index, version, tensors, copy.sampler, provenance, _copy=copy)
        self.live[index] = published
        return published

    def _publish_to_engine(self, index: int, engine: RolloutEngine) -> PolicyVersion:
        tensors = {n: t.detach().clone() for n, t in self.trainer.trainable_state().items()}
        version = trained_version(self.trainer, tensors)
        if self.keeper is not None:
            self.keeper.keep(version, tensors, step=index)
        assert self.engine_dir is not None, "an engine needs a folder for the adapters it loads"
        if not self.trainer.trains_adapter:
            sampler = self._publish_weights(version, engine, self.engine_dir.parent / "weights")
        else:
            folder = self.engine_dir / adapter_dirname(version)
            _save_once(self.trainer, folder)
            sampler = engine.publish(version, folder, version, folder_hash=tree_hash(folder))
        provenance = Provenance(self.loaded.base_hash, None, self.template_hash, sampler.info())
        published = PolicyVersion(index, version, tensors, sampler, provenance)
        self.live[index] = published
        return published

    def _publish_weights(self, version: str, engine: RolloutEngine, root: Path) -> Sampler:
        folder = root / adapter_dirname(version)
        _save_once(self.trainer, folder)
        sampler = engine.publish_weights(version, folder, folder_hash=tree_hash(folder))
        for old in root.iterdir():  # nothing samples an older version again (no staleness here)
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
        return sampler

    def open(self, index: int) -> None:
        """Let batches sample from version `index`."""
        self._event(index).set()

    async def wait(self, index: int) -> PolicyVersion:
        """Version `index` once it is published and open."""
        await self._event(index).wait()
        return self.live[index]

    def _event(self, index: int) -> asyncio.Event:
        return self._ready.setdefault(index, asyncio.Event())

    def retire_below(self, index: int) -> None:
        """Give back the copies of versions older than `index` that no batch is sampling from."""
        for old in [v for i, v in self.live.items() if i < index and v.users == 0]:
            del self.live[old.index]
            self._ready.pop(old.index, None)
            if self.engine is not None and all(v.version != old.version for v in self.live.values()):
                self.engine.retire(old.version)
            if old._copy is not None:
                self._spare.append(old._copy)

    def _take_copy(self) -> _Copy:
        if self._spare:
            return self._spare.pop()
        snapshot = SamplingSnapshot(self.trainer, self.dtype, always_copy=self.overlap)
        sampler = LocalSampler(
            snapshot.model,
            self.loaded.tokenizer,
            model_hash=self.loaded.base_hash,
            policy_version="",
            keep_bytes=self.keep_bytes,
        )
        self.copies_made += 1
        return _Copy(snapshot, sampler)
