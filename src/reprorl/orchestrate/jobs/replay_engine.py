"""Asking vLLM again for a finished run's rollouts: its engine started anew, each adapter checked and loaded.

A live replay of a vLLM-sampled rollout needs what sampled it: a server on the run's saved base
folder (or the run's URLs) holding the adapter of each turn's version under the same name. Each
adapter folder is checked against the tree hash the run recorded when it first loaded it, so the
replay asks the weights the record names. The servers are this replay's: started on first use,
logging to a scratch folder (the run's records are never written), stopped by `close`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from reprorl.config import RunSpec
from reprorl.errors import RecordError
from reprorl.orchestrate.run.engine import adapter_folder, replay_engine
from reprorl.policy.digest import tree_hash
from reprorl.policy.vllm_engine import EngineSampler, RolloutEngine
from reprorl.store import RunRecord


class EngineReplays:
    """The vLLM engines and adapters of the runs a replayer re-asks, started once each."""

    def __init__(self) -> None:
        self._engines: dict[str, RolloutEngine] = {}
        self._samplers: dict[tuple[str, str], EngineSampler] = {}
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    def sampler(self, record: RunRecord, spec: RunSpec, version: str) -> EngineSampler:
        """A sampler asking the run's engine for `version`'s adapter, loaded once checked."""
        key = (record.run_id, version)
        if key in self._samplers:
            return self._samplers[key]
        if not version.startswith("adapter:"):
            raise RecordError(
                f"{version} is fully fine-tuned weights, which a run keeps for its servers only while "
                "they serve them: a live replay re-asks vLLM for LoRA-trained versions only"
            )
        folder = adapter_folder(record, version)
        if not folder.is_dir():
            raise RecordError(f"run {record.run_id} kept no adapter folder for {version} ({folder})")
        recorded = {
            e.get("folder_hash")
            for e in record.events().records
            if e.get("event") == "engine_loaded" and e.get("adapter") == version
        }
        recorded.discard(None)
        found = tree_hash(folder)
        if not recorded:
            raise RecordError(f"run {record.run_id} recorded no folder hash for {version}: cannot check it")
        if found not in recorded:
            raise RecordError(
                f"the adapter folder of {version} in run {record.run_id} has changed since the run "
                f"loaded it (tree hash {found}, recorded {sorted(str(h) for h in recorded)})"
            )
        sampler = self._engine(record, spec).publish(version, folder, version, folder_hash=found)
        self._samplers[key] = sampler
        return sampler

    def _engine(self, record: RunRecord, spec: RunSpec) -> RolloutEngine:
        engine = self._engines.get(record.run_id)
        if engine is None:
            if self._scratch is None:
                self._scratch = tempfile.TemporaryDirectory(prefix="reprorl-replay-engine-")
            logs = Path(self._scratch.name) / record.run_id
            engine = self._engines[record.run_id] = replay_engine(spec, record, logs)
        return engine

    def close(self) -> None:
        for sampler in self._samplers.values():
            sampler.close()
        for engine in self._engines.values():
            engine.close()
        self._samplers.clear()
        self._engines.clear()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
