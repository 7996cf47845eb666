"""Replay check on the real model: record a SmolLM2 sampling run, then replay N random rollouts live.

Steps, in one scratch store: register the bundled SmolLM2 GGUF and the calculator task sets; fit an
SFT warm-start adapter on oracle demonstrations (so the policy calls tools and rollouts have tool
results); record a sampling run from it (tool noise on, so some calls time out); replay N random
rollouts in live mode (fresh sandboxes, tools and verifier re-run) and count the bit-identical ones.
It also answers "failed rollouts where any tool timed out" on the run's records.

    .venv/bin/python bench/replay.py [--sft-steps 8] [--steps 2] [--replays 100]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from importlib import resources
from pathlib import Path

from reprorl.config import RunSpec, resolve_spec
from reprorl.orchestrate.jobs.replay import Replayer
from reprorl.orchestrate.jobs.sample import sample_run
from reprorl.orchestrate.run.warm_start import sft_warm_start
from reprorl.policy import load_base
from reprorl.policy.gguf import bundled_gguf
from reprorl.store import Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import Split, TaskSet

TIMED_OUT = "(reward_total IS NULL OR reward_total < 1) AND list_contains(tool_outcomes, 'tool_timeout')"


def spec_for(args: argparse.Namespace) -> RunSpec:
    owner = "bench@reprorl"
    return RunSpec.model_validate(
        {
            "name": "replay-check",
            "seed": args.seed,
            "model": {
                "owner": owner,
                "base": "smollm2-135m-instruct@v1",
                "init_adapter": "calc-sft@v1",
                "sampling_dtype": args.dtype,
            },
            "data": {"owner": owner, "train": "calc-train@v1", "noise": {"timeout_p": args.timeout_p}},
            "learning": {
                "owner": owner,
                "group_size": args.group,
                "tasks_per_step": args.tasks,
                "max_tokens": args.max_tokens,
                "max_turns": 3,
                "rollout_concurrency": args.group * args.tasks,
            },
            "evaluation": {"owner": owner, "suites": ["calc-eval@v1"]},
        }
    )


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="reprorl-replay-"))
    store = Store(root / "home")
    store.add("smollm2-135m-instruct", bundled_gguf(), kind="model")
    examples = resources.files("reprorl") / "examples"
    for name in ("calc-train", "calc-eval"):
        with resources.as_file(examples / f"{name}.jsonl") as path:
            store.add(name, path, kind="taskset")
    train = TaskSet.from_jsonl("calc-train", store.read("calc-train@v1")).split(Split.TRAIN)

    started = time.perf_counter()
    loaded = load_base("smollm2-135m-instruct", store=store)
    spec = spec_for(args)
    adapter = spec.model.adapter
    assert adapter.kind == "lora"
    warm = await sft_warm_start(
        loaded,
        train,
        adapter,
        root / "adapter",
        steps=args.sft_steps,
        seed=args.seed,
        on_step=lambda step, loss, lr: print(f"sft step {step}: loss {loss:.3f}, lr {lr:.2g}", flush=True),
    )
    store.add("calc-sft", warm.adapter_dir, kind="adapter")
    seconds = time.perf_counter() - started
    print(f"warm start: {args.sft_steps} steps in {seconds:.0f} s, adapter {warm.adapter_hash}")

    started = time.perf_counter()
    resolved = resolve_spec(spec, store.pin)
    record = await sample_run(store, resolved, steps=args.steps, show_progress=False)
    rollouts = RolloutStore(record)
    total = rollouts.count()
    calls = rollouts.query(None, columns=["n_tool_calls"]).column(0).to_pylist()
    print(
        f"sampled run {record.run_id}: {total} records in {time.perf_counter() - started:.0f} s, "
        f"{sum(c > 0 for c in calls)} with tool calls ({sum(calls)} calls)"
    )
    timed_out = rollouts.query(TIMED_OUT, columns=["rollout_id", "termination", "tool_outcomes"])
    print(f"failed rollouts where any tool timed out ({TIMED_OUT!r}): {timed_out.num_rows}")

    import random

    ids = sorted(rollouts.query("NOT retried", columns=["rollout_id"]).column(0).to_pylist())
    chosen = random.Random(args.seed).sample(ids, min(args.replays, len(ids)))
    replayer = Replayer(store)
    started = time.perf_counter()
    identical = tokens = tool_results = 0
    for rollout_id in chosen:
        report = await replayer.replay(rollout_id, mode="live")
        identical += report.identical
        tokens += report.tokens
        tool_results += sum(len(t.tool_results) for t in rollouts.get(rollout_id).turns)
        if not report.identical:
            print(f"DIFFERS {rollout_id}: {report.first}")
    print(
        f"live replay: {identical}/{len(chosen)} bit-identical (tokens, logprobs, tool results, reward); "
        f"{tokens} tokens, {tool_results} tool results, {replayer.batches_sampled} batches re-run, "
        f"{time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sft-steps", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--timeout-p", type=float, default=0.2)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
