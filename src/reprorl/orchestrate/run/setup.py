"""What a run trains and measures, built from its spec: the trainer of `model.adapter` and the eval suites."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from reprorl.config import RunSpec
from reprorl.config.spec import LoraAdapter
from reprorl.errors import UserInputError
from reprorl.hashing import derive_seed
from reprorl.orchestrate.run.policies import torch_dtype
from reprorl.orchestrate.run.rollouts import load_taskset
from reprorl.policy import LoadedModel, load_adapter
from reprorl.store import Store
from reprorl.trainer import LocalTrainer
from reprorl.types import Split, Task


@dataclass(frozen=True)
class Suite:
    """A frozen eval suite as the loop uses it: its name, its pinned reference, its tasks."""

    name: str
    ref: str
    tasks: tuple[Task, ...]


def suite_of(store: Store, ref: str) -> Suite:
    """A stored task set as an eval suite: its eval and holdout tasks, named by its version's name."""
    resolved = store.resolve(ref)
    taskset = load_taskset(store, ref)
    tasks = taskset.split(Split.EVAL) + taskset.split(Split.HOLDOUT)
    return Suite(resolved.version.name if resolved.version else ref, ref, tasks)


def eval_suites(store: Store, spec: RunSpec) -> list[Suite]:
    return [suite_of(store, str(ref)) for ref in spec.evaluation.suites]


def build_trainer(store: Store, loaded: LoadedModel, spec: RunSpec) -> LocalTrainer:
    """The trainer of `model.adapter`: a LoRA adapter (new, or `model.init_adapter`), or every weight.

    Its logprobs are at `learning.temperature`, the distribution the rollouts are sampled from (the
    sampler's logprobs are too), so the loss's ratios compare like with like."""
    trainer = _trainer(store, loaded, spec)
    trainer.temperature = trained_temperature(spec.learning.temperature)
    return trainer


def trained_temperature(sampled: float) -> float:
    """The temperature a trainer computes logprobs at for rollouts sampled at `sampled`: the same,
    except greedy sampling (0), whose logprobs the sampler reports under the unscaled distribution."""
    return sampled if sampled > 0 else 1.0


def _trainer(store: Store, loaded: LoadedModel, spec: RunSpec) -> LocalTrainer:
    adapter = spec.model.adapter
    autocast = torch_dtype(spec.model.train_dtype, "model.train_dtype") == torch.bfloat16
    if not isinstance(adapter, LoraAdapter):
        if spec.model.init_adapter is not None:
            raise UserInputError(
                "an init_adapter needs model.adapter.kind = 'lora'", field="model.init_adapter"
            )
        return LocalTrainer.full(loaded, autocast_bf16=autocast)
    if spec.model.init_adapter is None:
        return LocalTrainer.lora(
            loaded, adapter, seed=derive_seed(spec.seed, "adapter-init"), autocast_bf16=autocast
        )
    ref = str(spec.model.init_adapter)
    with tempfile.TemporaryDirectory(prefix="reprorl-init-adapter-") as scratch:
        folder = store.export(ref, Path(scratch) / "adapter")
        config = json.loads((folder / "adapter_config.json").read_text())
        saved = (config.get("r"), float(config.get("lora_alpha", 0)), set(config.get("target_modules") or ()))
        if saved != (adapter.rank, adapter.alpha, set(adapter.targets)):
            raise UserInputError(
                f"{ref} has rank {saved[0]}, alpha {saved[1]}, targets {sorted(saved[2])}; set model.adapter "
                "to the same to continue training it",
                field="model.adapter",
            )
        model = load_adapter(
            loaded.model,
            folder,
            trainable=True,
            expected_hash=store.resolve(ref).hash,
            base_hash=loaded.base_hash,
        )
    # A PeftModel stands in for the transformers model it wraps.
    trainer = LocalTrainer(model, loaded.tokenizer, base_hash=loaded.base_hash, autocast_bf16=autocast)  # type: ignore[arg-type]
    trainer.init_adapter = store.resolve(ref).hash
    return trainer
