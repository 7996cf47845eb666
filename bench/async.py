"""Trainer busy fraction and samples/s, synchronous against asynchronous (staleness 1, 2, 4), in one run.

The workload is agent RL with slow tools: SmolLM2-135M-Instruct (LoRA r16 on every linear layer,
warm-started once by SFT on oracle demonstrations, the same adapter for every configuration) on the
calculator family, 16 tasks x 4 rollouts per step, each tool call delayed by a lognormal latency
(`data.noise.latency_s` x exp(sigma z): a heavy tail, seeded per episode, so every configuration
sees the same delays for the same episodes). Per configuration it runs `--steps` policy-gradient
steps through the real loop and reads its records:

- RL wall: from the end of the step-0 eval point to the last update's metric line;
- trainer busy fraction: the updates' wall seconds over that span, and in the steady state (from
  the end of the first update to the end of the last, leaving out the pipeline's fill);
- samples/s: rollouts trained on over that span;
- mean and max staleness, and the seconds the trainer waited for a batch.

A synchronous step waits for its slowest episode; the asynchronous loop samples the next steps
meanwhile, with each step's batch either the groups planned for it (`learning.assembly =
"planned"`, under `--lockstep`) or the first groups to finish (`"arrival"`, with the `arrival`
lockstep: no group waits for another group's tool call, groups ready together sample together,
and when more wait than a batch holds the groups due earliest go first). `--assembly` picks which
of the two are run (both by default). Target: busy >= 0.9 for the asynchronous configurations.
Run it alone on the machine.

Where sampling runs. In a deployment inference and training have hardware of their own; here the
sampler is one Ray rollout worker (`learning.rollout_workers = 1`, `--ray local`: a process of its
own) and the trainer stays in this process, each on one torch thread (`--threads 1`), so each has
a core of the two. `--in-process` samples in this process instead: the sampler's and the trainer's
threads then contend for the interpreter and the cores, and an update that overlaps sampling takes
two to three times as long (measured), which measures the box, not the loop.

What bounds the figures: a sample from version v must be trained by step v + max_staleness, so
whatever the order an episode has about max_staleness updates' time from its start to finish
before the trainer waits for it; the busy fraction is high only once max_staleness x update time
exceeds most groups' latency (`--tasks` scales the update). Planned batches wait for the slowest
of their episodes (each turn waits for the batch's slowest tool call under the batch lockstep);
arrival batches wait only for a group that is due. The run also prints the hardware bound, update
time over a batch's sampling CPU seconds, from the synchronous run. The overall busy fraction
counts the pipeline's fill (the first batch, which every loop waits for) against a short run; the
steady-state one is what a long run tends to.

On 2 cores the defaults take about 35 minutes with `--assembly arrival` (the synchronous run alone
about 16) and about an hour with both assemblies.

    .venv/bin/python bench/async.py [--steps 6] [--tasks 16] [--latency 3.0] [--sigma 1.0]
        [--staleness 1 2 4] [--assembly planned arrival]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from reprorl.config import LoraAdapter, load_spec, resolve_spec
from reprorl.config.load import read_toml
from reprorl.envs.families import calculator
from reprorl.orchestrate.jobs.train import train_run
from reprorl.orchestrate.run.rollouts import load_taskset
from reprorl.orchestrate.run.warm_start import sft_warm_start
from reprorl.policy import load_base
from reprorl.policy.gguf import bundled_gguf
from reprorl.store import RunRecord, Store
from reprorl.types import Split, TaskSet

SFT_STEPS = 8


def _time(line: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(str(line["time"]).replace("Z", "+00:00")).timestamp()


def measure(record: RunRecord) -> dict[str, float]:
    lines = record.metrics().records
    steps = [m for m in lines if m.get("stage") is None]
    start = next(m for m in lines if m.get("stage") == "eval" and m["step"] == 0)
    wall = _time(steps[-1]) - _time(start)
    train = sum(m["train_s"] for m in steps)
    rollouts = sum(m["rollouts"] for m in steps)
    staleness = [m.get("staleness_mean", 0.0) for m in steps]
    # Steady state: from the end of the first update to the end of the last, so filling the
    # pipeline (the first batch, which every loop waits for) is left out.
    steady = _time(steps[-1]) - _time(steps[0])
    return {
        "wall_s": wall,
        "busy": train / wall,
        "busy_steady": sum(m["train_s"] for m in steps[1:]) / steady,
        "samples_per_s": rollouts / wall,
        "staleness_mean": sum(staleness) / len(staleness),
        "staleness_max": max(m.get("staleness_max", 0.0) for m in steps),
        "wait_s": sum(m.get("timing/wait_s", 0.0) for m in steps),
        "train_s_per_step": train / len(steps),
        "env_share": sum(m["timing/env_share"] for m in steps) / len(steps),
        "sample_cpu_s_per_step": sum(m["rollout_cpu_s"] for m in steps) / len(steps),
    }


async def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="reprorl-bench-async-"))
    store = Store(root / "home")
    store.add("smollm2-135m-instruct", bundled_gguf(), kind="model")
    with resources.as_file(resources.files("reprorl") / "examples" / "calc-train.jsonl") as path:
        store.add("calc-train", path, kind="taskset")
    tiny_suite = calculator.generate(0, eval=2, holdout=0)[Split.EVAL].tasks
    store.add_bytes(
        "calc-bench-eval", TaskSet(name="calc-bench-eval", tasks=tiny_suite).to_jsonl(), kind="taskset"
    )
    overrides = [
        "learning.sft_steps=0",
        "model.init_adapter=bench-sft",
        f"learning.steps={args.steps}",
        f"evaluation.every_steps={args.steps}",
        'evaluation.suites=["calc-bench-eval"]',
        "evaluation.samples_per_task=1",
        f"learning.tasks_per_step={args.tasks}",
        "learning.group_size=4",
        "learning.max_tokens=48",
        f"data.noise.latency_s={args.latency}",
        f"data.noise.latency_sigma={args.sigma}",
        "learning.rollout_workers=1",
    ]
    with resources.as_file(resources.files("reprorl") / "configs" / "demo.toml") as spec_file:
        adapter = LoraAdapter.model_validate(read_toml(spec_file)["model"]["adapter"])
        loaded = load_base(store.pin_newest("smollm2-135m-instruct"), store=store)
        tasks = load_taskset(store, store.pin_newest("calc-train")).split(Split.TRAIN)
        print(f"warm start: {SFT_STEPS} SFT steps ...", flush=True)
        await sft_warm_start(
            loaded, tasks, adapter, root / "sft", steps=SFT_STEPS, batch_size=8, lr=1e-3, seed=0
        )
        store.add("bench-sft", root / "sft", kind="adapter", meta={"base_model": loaded.base_hash})
        del loaded
        configs = [("sync", "planned", args.lockstep, 0)]
        for assembly in args.assembly:
            lockstep = "arrival" if assembly == "arrival" else args.lockstep
            configs += [("async", assembly, lockstep, k) for k in args.staleness]
        results = []
        for mode, assembly, lockstep, k in configs:
            config = [
                f"learning.mode={mode}",
                f"learning.assembly={assembly}",
                f"learning.lockstep={lockstep}",
                f"learning.max_staleness={k}",
            ]
            spec = resolve_spec(
                load_spec(spec_file, [*overrides, *config], pin_bare=store.pin_newest), store.pin
            )
            print(
                f"{mode} {assembly} ({lockstep} lockstep) staleness {k}: {args.steps} steps ...", flush=True
            )
            record = await train_run(store, spec, ray=None if args.in_process else "local")
            results.append((mode, assembly, lockstep, k, measure(record)))
    print()
    print(
        f"lognormal tool latency: median {args.latency} s, sigma {args.sigma}; "
        f"{args.steps} steps of {args.tasks} tasks x 4 rollouts; "
        f"sampling {'in process' if args.in_process else 'in a Ray worker'}, {args.threads} thread(s) each"
    )
    print(
        "| loop | batches | lockstep | staleness | busy | busy, steady | samples/s | RL wall s "
        "| train s/step | sampling CPU s/step | wait s | staleness mean/max |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    sync_rate = results[0][4]["samples_per_s"]
    for mode, assembly, lockstep, k, r in results:
        rate = f"{r['samples_per_s']:.3f} ({r['samples_per_s'] / sync_rate:.2f}x)"
        print(
            f"| {mode} | {assembly} | {lockstep} | {k} | {r['busy']:.2f} | {r['busy_steady']:.2f} | {rate}"
            f" | {r['wall_s']:.0f} | {r['train_s_per_step']:.1f} | {r['sample_cpu_s_per_step']:.1f}"
            f" | {r['wait_s']:.0f} | {r['staleness_mean']:.1f}/{r['staleness_max']:.0f} |"
        )
    sync = results[0][4]
    # With a core each, the trainer can be busy at most while sampling keeps up with it.
    bound = min(1.0, sync["train_s_per_step"] / sync["sample_cpu_s_per_step"])
    print(
        f"\nhardware bound (sync run): an update takes {sync['train_s_per_step']:.1f} s, sampling a batch "
        f"{sync['sample_cpu_s_per_step']:.1f} CPU s, so busy <= {bound:.2f} once sampling is the bottleneck"
    )
    print(f"episode time in tools and env (sync run): {sync['env_share']:.0%}; records: {root}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--latency", type=float, default=3.0, help="median tool latency, seconds")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of the tool latency")
    parser.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--tasks", type=int, default=16, help="tasks (groups of 4) per step: the update size, hence its time"
    )
    parser.add_argument(
        "--lockstep",
        choices=["batch", "group"],
        default="batch",
        help="whose turns wait for each other (learning.lockstep) in the sync and planned configurations",
    )
    parser.add_argument(
        "--assembly",
        choices=["planned", "arrival"],
        nargs="+",
        default=["planned", "arrival"],
        help="which async batches to run (learning.assembly); arrival ones use the arrival lockstep",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of this process: with 1, sampling and training each have a core of their own",
    )
    parser.add_argument(
        "--in-process", action="store_true", help="sample in this process, not in a Ray rollout worker"
    )
    parser.add_argument("--keep", help="keep the scratch store here")
    asyncio.run(main(parser.parse_args()))
