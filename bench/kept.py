"""Kept caches on multi-turn rollouts: one step of sql episodes sampled with and without them, same seeds.

A later turn of an episode starts from the keys and values its previous turn left with the sampler
(`model.kept_cache_mib`), so only the tool results and the new generation prompt are prefilled.
This samples the same step of configs/sql.toml's groups twice per repeat (kept caches off, then on,
interleaved), from SmolLM2 with a stored adapter (`--adapter`, a folder such as a run's `adapter/`)
or a short SFT warm start on sql demonstrations, and prints per variant: turns, context positions,
the share taken from kept caches, sampled tokens, the process CPU seconds of the step (best of
`--repeat`), the sampler's own CPU seconds, and the ratio.

    python bench/kept.py [--adapter DIR] [--sft-steps 16] [--tasks 8] [--group 4] [--repeat 1]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from reprorl.config import load_spec, resolve_spec
from reprorl.orchestrate.jobs.sample import sample_run
from reprorl.orchestrate.run.warm_start import sft_warm_start
from reprorl.policy import load_base
from reprorl.policy.gguf import bundled_gguf
from reprorl.store import Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import Split, TaskSet

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "sql.toml"


@dataclass
class Step:
    turns: int
    positions: int  # context positions over every turn (what a prefill from scratch would hold)
    reused: int  # of them, taken from kept caches
    sampled: int
    cpu_s: float  # the step's process CPU
    sampler_cpu_s: float  # the sampler's own, summed over rollouts


async def prepare(root: Path, args: argparse.Namespace) -> Store:
    store = Store(root / "home")
    store.add("smollm2-135m-instruct", bundled_gguf(), kind="model")
    examples = resources.files("reprorl") / "examples"
    for name in ("sql-train", "sql-eval"):
        with resources.as_file(examples / f"{name}.jsonl") as path:
            store.add(name, path, kind="taskset")
    if args.adapter is not None:
        store.add("sql-policy", args.adapter, kind="adapter")
        return store
    train = TaskSet.from_jsonl("sql-train", store.read("sql-train@v1")).split(Split.TRAIN)
    spec = load_spec(RECIPE, [], pin_bare=store.pin_newest)
    adapter = spec.model.adapter
    assert adapter.kind == "lora"
    started = time.perf_counter()
    warm = await sft_warm_start(
        load_base("smollm2-135m-instruct", store=store),
        train[:64],
        adapter,
        root / "adapter",
        steps=args.sft_steps,
        lr=spec.learning.sft_lr,
        seed=0,
    )
    store.add("sql-policy", warm.adapter_dir, kind="adapter")
    print(f"warm start: {args.sft_steps} SFT steps in {time.perf_counter() - started:.0f} s", flush=True)
    return store


async def one_step(store: Store, args: argparse.Namespace, mib: int) -> Step:
    overrides = [
        "model.init_adapter=sql-policy",
        f"model.kept_cache_mib={mib}",
        f"learning.tasks_per_step={args.tasks}",
        f"learning.group_size={args.group}",
        'evaluation.suites=["sql-eval"]',
    ]
    spec = resolve_spec(load_spec(RECIPE, overrides, pin_bare=store.pin_newest), store.pin)
    started = time.process_time()
    record = await sample_run(store, spec, steps=1, show_progress=False)
    cpu = time.process_time() - started
    step = Step(0, 0, 0, 0, cpu, 0.0)
    for trajectory in RolloutStore(record).trajectories(None):
        context = 0
        for turn in trajectory.turns:
            context += len(turn.prompt_token_ids)
            step.turns += 1
            step.positions += context
            step.reused += turn.reused
            step.sampled += len(turn.token_ids)
            context += len(turn.token_ids)
        step.sampler_cpu_s += trajectory.cpu_s or 0.0
    return step


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="reprorl-kept-"))
    store = await prepare(root, args)
    best: dict[int, Step] = {}
    for _ in range(args.repeat):
        for mib in (0, args.mib):
            step = await one_step(store, args, mib)
            if mib not in best or step.cpu_s < best[mib].cpu_s:
                best[mib] = step
    print(
        f"{'kept cache':<12}{'turns':>6}{'positions':>11}{'reused':>8}{'sampled':>9}{'cpu s':>8}"
        f"{'sampler s':>11}"
    )
    for mib, step in best.items():
        name = "off" if mib == 0 else f"{mib} MiB"
        share = step.reused / max(step.positions, 1)
        print(
            f"{name:<12}{step.turns:>6}{step.positions:>11}{share:>8.0%}{step.sampled:>9}"
            f"{step.cpu_s:>8.1f}{step.sampler_cpu_s:>11.1f}"
        )
    off, on = best[0], best[args.mib]
    print(
        f"step CPU off/on: {off.cpu_s / on.cpu_s:.2f}x; "
        f"sampler CPU off/on: {off.sampler_cpu_s / on.sampler_cpu_s:.2f}x"
    )
    if (off.turns, off.sampled) != (on.turns, on.sampled):
        print("note: the two variants' episodes differ (other bits led to other tokens); compare per token")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--adapter", type=Path, default=None, help="A stored adapter folder to sample with.")
    parser.add_argument("--sft-steps", type=int, default=16, help="Warm-start steps when no --adapter.")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--mib", type=int, default=2048, help="model.kept_cache_mib of the 'on' variant.")
    parser.add_argument("--repeat", type=int, default=1)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
