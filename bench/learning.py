"""Learning check on the real model: held-out success before and after RL, for several seeds, with 95% CIs.

Per seed, in one scratch store: the demo recipe (`configs/demo.toml`: SmolLM2-135M-Instruct, LoRA
r16 on every linear layer, 8 SFT steps on oracle demonstrations of which a quarter are deliberately
wrong, then 10 PPO-clip steps of 4 tasks x 8 rollouts at lr 3e-4 on the calculator family, sampled
in bfloat16) with that seed, evaluated on a held-out suite (the family's eval and holdout splits,
never trained on) before the first RL step and after the last. It prints per seed: success before
and after (bootstrap 95% interval over tasks), the paired change with its interval and p-value,
whether the two intervals overlap, and the CPU and wall minutes the RL phase took (rollouts +
updates; eval points excluded). Run it alone, or give each process one thread
(`OMP_NUM_THREADS=1`): torch processes sharing two cores with two threads each wait on each other.

    .venv/bin/python bench/learning.py [--seeds 0 1 2] [--steps N] [--lr LR] [--heldout 128] [--keep DIR]

Then the sql and files families with the same recipe (`--families`), whatever they reach.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from reprorl.config import load_spec, resolve_spec
from reprorl.envs.families import calculator, files, sql
from reprorl.evaluation import intervals_overlap
from reprorl.orchestrate.jobs.train import train_run
from reprorl.orchestrate.run.outcome import eval_outcomes
from reprorl.policy.gguf import bundled_gguf
from reprorl.store import RunRecord, Store
from reprorl.types import Split, TaskSet

FAMILIES = {"calc": calculator, "sql": sql, "files": files}


def register(store: Store, family: str, heldout: int) -> None:
    """Train split as shipped; a held-out suite of the eval + holdout splits, `heldout` tasks in all."""
    store.add("smollm2-135m-instruct", bundled_gguf(), kind="model")
    with resources.as_file(resources.files("reprorl") / "examples" / f"{family}-train.jsonl") as path:
        store.add(f"{family}-train", path, kind="taskset")
    sets = FAMILIES[family].generate(0, eval=heldout // 2, holdout=heldout - heldout // 2)
    tasks = sets[Split.EVAL].tasks + sets[Split.HOLDOUT].tasks
    store.add_bytes(
        f"{family}-heldout", TaskSet(name=f"{family}-heldout", tasks=tasks).to_jsonl(), kind="taskset"
    )


def rl_minutes(record: RunRecord) -> tuple[float, float]:
    steps = [m for m in record.metrics().records if m.get("stage") is None]
    cpu = sum(m["rollout_cpu_s"] + m["train_cpu_s"] for m in steps) / 60
    wall = sum(m["rollout_s"] + m["train_s"] for m in steps) / 60
    return cpu, wall


async def one(family: str, seed: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    store = Store(root / f"{family}-{seed}")
    register(store, family, args.heldout)
    overrides = [
        f"seed={seed}",
        f"name={family}-learning",
        f"data.train={family}-train",
        f'evaluation.suites=["{family}-heldout"]',
        "evaluation.samples_per_task=1",
    ]
    if args.steps is not None:  # else the recipe's own steps and learning rate
        overrides += [f"learning.steps={args.steps}", f"evaluation.every_steps={args.steps}"]
    if args.lr is not None:
        overrides.append(f"learning.lr={args.lr}")
    with resources.as_file(resources.files("reprorl") / "configs" / "demo.toml") as spec_file:
        spec = resolve_spec(load_spec(spec_file, overrides, pin_bare=store.pin_newest), store.pin)
    record = await train_run(store, spec)
    (outcome,) = eval_outcomes(record, seed=seed)
    cpu, wall = rl_minutes(record)
    return {"family": family, "seed": seed, "outcome": outcome, "cpu_min": cpu, "wall_min": wall}


def row(result: dict[str, Any]) -> str:
    o = result["outcome"]
    overlap = "overlap" if intervals_overlap(o.before, o.after) else "apart"
    return (
        f"{result['family']:<6}{result['seed']:>5}  {o.before!s:<26}{o.after!s:<26}"
        f"{o.change.estimate.value:+.3f} [{o.change.estimate.low:+.2f}, {o.change.estimate.high:+.2f}] "
        f"p={o.change.p_value:.3g}  {overlap:<8}{result['cpu_min']:>7.1f}{result['wall_min']:>7.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="RL steps (default: the recipe's)")
    parser.add_argument("--lr", type=float, default=None, help="RL learning rate (default: the recipe's)")
    parser.add_argument("--heldout", type=int, default=128, help="held-out tasks per family")
    parser.add_argument("--families", nargs="+", default=["calc"], choices=sorted(FAMILIES))
    parser.add_argument("--keep", type=Path, default=None, help="keep the stores (run records) here")
    args = parser.parse_args()
    print(
        f"{'family':<6}{'seed':>5}  {'before [95% CI] n':<26}{'after [95% CI] n':<26}"
        f"{'change (paired) [95% CI]':<34}{'CIs':<8}{'RL cpu':>7}{'wall':>7}  (minutes)"
    )
    with tempfile.TemporaryDirectory(prefix="reprorl-learning-") as scratch:
        root = args.keep or Path(scratch)
        for family in args.families:
            for seed in args.seeds:
                print(row(asyncio.run(one(family, seed, args, root))), flush=True)


if __name__ == "__main__":
    main()
