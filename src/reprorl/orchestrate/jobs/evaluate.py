"""Offline evaluation: a run's final or checkpointed weights, or a registered adapter, on frozen suites.

The weights go through the loop's own path: the trainer the run spec builds, the state loaded into
it, the sampling snapshot in the spec's sampling dtype, the same runner settings, and the eval
seeds of the run seed. An offline point therefore equals the in-loop point of the same weights and
seed to the last digit, and names the same `policy_version`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from peft import PeftModel, set_peft_model_state_dict
from safetensors.torch import load_file

from reprorl.config import RunSpec
from reprorl.config.load import stored_spec
from reprorl.errors import UserInputError
from reprorl.evaluation.point import EvalPoint, evaluate
from reprorl.orchestrate.pipeline.versions import trained_version
from reprorl.orchestrate.run.checkpoint import GOOD_PREFIX, STEP_PREFIX, checkpoints_root, verify_checkpoint
from reprorl.orchestrate.run.policies import OpenedPolicy, kept_bytes, load_run_base, torch_dtype
from reprorl.orchestrate.run.rollouts import runner_for
from reprorl.orchestrate.run.setup import Suite, build_trainer, suite_of
from reprorl.policy import LoadedModel
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.sampling import LocalSampler
from reprorl.rollout.episode import Provenance
from reprorl.store import RunRecord, Store
from reprorl.trainer import LocalTrainer
from reprorl.trainer.snapshot import SamplingSnapshot


@dataclass(frozen=True)
class OfflineEval:
    """What was measured: the target as given, the weights' version, and one point per suite."""

    target: str
    policy_version: str
    seed: int
    points: list[EvalPoint]


def _load_final(trainer: LocalTrainer, folder: Path) -> None:
    """The weights a run saved at its end (peft adapter folder, or a full model folder)."""
    if isinstance(trainer.model, PeftModel):
        state = load_file(str(folder / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(trainer.model, state)
        if getattr(result, "unexpected_keys", None):
            raise UserInputError(f"{folder} does not fit the run's adapter: {result.unexpected_keys[:3]}")
        return
    weights = load_file(str(folder / "model.safetensors"))
    _, unexpected = trainer.model.load_state_dict(weights, strict=False)
    if unexpected:
        raise UserInputError(f"{folder} does not fit the run's model: {unexpected[:3]}")


def _checkpoint(record: RunRecord, step: int) -> Path:
    root = checkpoints_root(record)
    for prefix in (STEP_PREFIX, GOOD_PREFIX):
        path = root / f"{prefix}{step:06d}"
        if path.is_dir():
            verify_checkpoint(path)
            return path
    kept = sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []
    raise UserInputError(
        f"run {record.run_id} keeps no checkpoint of step {step} (kept: {', '.join(kept) or 'none'})",
        field="--step",
    )


async def evaluate_target(
    store: Store,
    target: str,
    suites: Sequence[str],
    *,
    step: int | None = None,
    seed: int | None = None,
    samples_per_task: int | None = None,
    settings: RunSpec | None = None,
) -> OfflineEval:
    """Evaluate `target` on `suites`: a run id (its final weights, or its checkpoint of `step`), a
    registered adapter (with the settings and seed of the run that trained it), or a base model
    (with the sampling and env settings, and seed, of the run spec `settings`)."""
    if not suites:
        raise UserInputError("name at least one suite, e.g. --suite calc-eval@v1", field="--suite")
    adapter_folder: Path | None = None
    if (store.runs_dir / target).is_dir():
        record = RunRecord(store, target)
    else:
        version = store.resolve(target).version
        if version is not None and version.kind == "model":
            return await _evaluate_base(store, target, suites, settings, seed, samples_per_task)
        if version is None or version.kind != "adapter" or "run_id" not in version.meta:
            raise UserInputError(
                f"{target!r} is neither a run id nor an adapter trained by a recorded run", field="TARGET"
            )
        record = RunRecord(store, str(version.meta["run_id"]))
        adapter_folder = store.export(target, Path(tempfile.mkdtemp(prefix="reprorl-eval-")) / "adapter")
    spec = stored_spec(record.spec())
    loaded = load_run_base(store, spec)
    trainer = build_trainer(store, loaded, spec)
    if step is not None:
        trainer.load_state(_checkpoint(record, step))
    else:
        folder = adapter_folder or record.path / "adapter"
        if not folder.is_dir():
            raise UserInputError(
                f"run {record.run_id} has no final weights (status {record.status()['status']}); "
                "pass --step N to evaluate one of its checkpoints",
                field="TARGET",
            )
        _load_final(trainer, folder)
        if adapter_folder is not None:
            shutil.rmtree(adapter_folder.parent, ignore_errors=True)
    resolved = [suite_of(store, ref) for ref in suites]
    run_seed = spec.seed if seed is None else seed
    points = await _measure(
        store.root, trainer, loaded, spec, resolved, run_seed, samples_per_task, record.run_id
    )
    label = target if step is None else f"{target} step {step}"
    return OfflineEval(label, points[0].policy_version, run_seed, points)


async def _evaluate_base(
    store: Store,
    target: str,
    suites: Sequence[str],
    settings: RunSpec | None,
    seed: int | None,
    samples_per_task: int | None,
) -> OfflineEval:
    if settings is None:
        raise UserInputError(
            f"{target} is a base model: give --spec FILE for the sampling and env settings", field="--spec"
        )
    loaded = load_run_base(store, settings, target)
    trainer = LocalTrainer(loaded.model, loaded.tokenizer, base_hash=loaded.base_hash)
    resolved = [suite_of(store, ref) for ref in suites]
    run_seed = settings.seed if seed is None else seed
    version = f"base:{loaded.base_hash}"
    points = await _measure(
        store.root, trainer, loaded, settings, resolved, run_seed, samples_per_task, "base", version
    )
    return OfflineEval(target, version, run_seed, points)


async def _measure(
    store_root: Path,
    trainer: LocalTrainer,
    loaded: LoadedModel,
    spec: RunSpec,
    suites: Sequence[Suite],
    run_seed: int,
    samples_per_task: int | None,
    run_id: str,
    version: str | None = None,
) -> list[EvalPoint]:
    snapshot = SamplingSnapshot(trainer, torch_dtype(spec.model.sampling_dtype))
    version = version or trained_version(trainer)
    sampler = LocalSampler(
        snapshot.model,
        loaded.tokenizer,
        model_hash=loaded.base_hash,
        policy_version=version,
        keep_bytes=kept_bytes(spec),
    )
    renderer = ChatRenderer(loaded.tokenizer)
    provenance = Provenance(loaded.base_hash, None, renderer.template_hash, sampler.info())
    opened = OpenedPolicy(loaded, sampler, renderer, provenance)
    points = []
    families = {t.family for suite in suites for t in suite.tasks}
    async with runner_for(opened, spec, f"offline-{run_id}", store_root, families=families) as runner:
        for suite in suites:
            points.append(
                await evaluate(
                    runner,
                    suite.name,
                    suite.tasks,
                    run_id=f"offline-{run_id}",
                    run_seed=run_seed,
                    step=0,
                    policy_version=version,
                    samples_per_task=samples_per_task or spec.evaluation.samples_per_task,
                    thresholds=spec.evaluation.thresholds,
                    temperature=spec.evaluation.temperature,
                )
            )
    return points
