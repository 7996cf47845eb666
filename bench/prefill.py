"""Multi-turn prefill: a batch's remainders in runs of like length against one padded pass, same prompts.

In a multi-turn rollout every turn's prompt is the episode's whole context: the shared prefix
(system prompt, tool schemas) is computed once, and what follows it differs by row, from a first
turn's task to a third turn's whole exchange (23 to 324 tokens in one batch of a sql run). One
padded pass computes rows x the longest remainder; runs of like length compute little more than the
remainders themselves. This prints, per dtype, both passes' positions and seconds (best of
`--repeat`, interleaved, in this one process) and their ratio, on SmolLM2 with `--prefix` shared
tokens and `--batch` remainders of lengths spread evenly over `--tails`.

    python bench/prefill.py [--batch 32] [--prefix 648] [--tails 23 324] [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import torch
from transformers import DynamicCache

import reprorl.policy.prefill as prefill_module
from reprorl.policy import LoadedModel, load_base, tiny_model
from reprorl.policy.sampling import LocalSampler


@contextmanager
def one_pass() -> Iterator[None]:
    """Every remainder in one padded pass (as before runs): the baseline."""
    ratio, slack = prefill_module.RUN_RATIO, prefill_module.RUN_SLACK
    prefill_module.RUN_RATIO, prefill_module.RUN_SLACK = 0.0, 1 << 30
    try:
        yield
    finally:
        prefill_module.RUN_RATIO, prefill_module.RUN_SLACK = ratio, slack


def prompts_for(
    loaded: LoadedModel, batch: int, prefix: int, tails: tuple[int, int]
) -> list[tuple[int, ...]]:
    rng = random.Random(0)
    vocab = len(loaded.tokenizer)
    head = tuple(rng.randrange(vocab) for _ in range(prefix))
    low, high = tails
    lengths = [low + (high - low) * i // max(batch - 1, 1) for i in range(batch)]
    rng.shuffle(lengths)
    return [head + tuple(rng.randrange(vocab) for _ in range(n)) for n in lengths]


def timed(sampler: LocalSampler, prompts: list[tuple[int, ...]]) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        sampler._prefill(prompts, 1, DynamicCache(config=sampler.model.config))
    return time.perf_counter() - start


def positions(prompts: list[tuple[int, ...]], runs: bool) -> int:
    prefix = prefill_module.shared_prefix(prompts)
    tails = [len(p) - prefix for p in prompts]
    if not runs:
        return len(tails) * max(tails)
    return sum(len(run) * max(tails[i] for i in run) for run in prefill_module.length_runs(tails))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prefix", type=int, default=648, help="shared prefix tokens")
    parser.add_argument("--tails", type=int, nargs=2, default=(23, 324), help="remainder lengths, low high")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the tiny test model: a smoke run")
    args = parser.parse_args()
    loaded = tiny_model(0) if args.quick else load_base()
    prompts = prompts_for(loaded, args.batch, args.prefix, tuple(args.tails))
    padded, packed = positions(prompts, False), positions(prompts, True)
    runs = len(prefill_module.length_runs([len(p) - args.prefix for p in prompts]))
    print(
        f"{args.batch} rows, {args.prefix} shared tokens, remainders {args.tails[0]}-{args.tails[1]}: "
        f"one pass computes {padded} remainder positions, {runs} runs {packed} ({padded / packed:.2f}x fewer)"
    )
    for dtype in (torch.float32, torch.bfloat16):
        cast(torch.nn.Module, loaded.model).to(dtype)  # in place; transformers' `to` hides torch's type
        sampler = LocalSampler.from_loaded(loaded)
        best = {"one pass": float("inf"), "runs": float("inf")}
        for _ in range(args.repeat):
            with one_pass():
                best["one pass"] = min(best["one pass"], timed(sampler, prompts))
            best["runs"] = min(best["runs"], timed(sampler, prompts))
        print(
            f"{str(dtype).removeprefix('torch.'):<9} one pass {best['one pass']:6.2f} s   runs "
            f"{best['runs']:6.2f} s   {best['one pass'] / best['runs']:.2f}x faster"
        )


if __name__ == "__main__":
    main()
