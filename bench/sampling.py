"""Decode throughput of the local sampler against the compute bound measured in the same run.

The bound is what the matmul units allow: a decode step of a batch costs 2·params·batch FLOPs,
so bound tokens/s = matmul FLOP/s ÷ (2·params), with FLOP/s measured here on a large GEMM in the
same dtype. Prints tokens/s and ratio to that bound for plain `model.generate` and for
`LocalSampler.sample`, on the same prompts (short chat prompts, left padding), for float32 and
for bfloat16 where the CPU has native bf16. Stop tokens and stop strings are switched off in both,
so every row decodes exactly `--max-tokens` tokens at the full batch and only generated tokens
count. Each figure is the best of `--repeat` runs after one warm-up (the machine may be shared).

    python bench/sampling.py [--batch 32] [--max-tokens 128] [--dtype both|float32|bfloat16]
        [--repeat 2] [--threads N] [--quick]

`--quick` uses the tiny test model instead of SmolLM2-135M: a smoke run, not a measurement.

Each dtype also prints where a `LocalSampler` run's time goes, from one run under the torch
profiler: each operator's own time attributed to the GEMMs (the packed linears and the head), the
attention over the KV cache (SDPA), the norms and the rotary embedding (the model's modules, marked
by hooks), sampling (`choose`, marked by a wrapper), other operators, and the time outside any
operator (Python, the loop, the framework). Shares, not times: the profiler adds its own cost.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from timing import best_of

import reprorl.policy.sampling as sampling_module
from reprorl.policy import LoadedModel, load_base, tiny_model
from reprorl.policy.fast_llama import PackedLlama, fast_path_applies, packing_key
from reprorl.policy.sampling import LocalSampler, SampleRequest
from reprorl.types import SamplingParams

# The whole decode step's share of the compute bound to reach, by dtype: where the GEMMs alone are.
TARGETS = {"float32": 0.58, "bfloat16": 0.50}
TOPICS = [
    "What is 2+2?",
    "Name a prime number.",
    "Write a haiku about rain.",
    "Explain recursion briefly.",
    "What is the capital of France?",
    "List three colours.",
    "How do magnets work?",
    "Say hello in Spanish.",
    "Why is the sky blue?",
    "Give me a fun fact.",
    "What is a list in Python?",
    "Describe a cat.",
    "How many legs has a spider?",
    "Suggest a name for a dog.",
    "What does CPU stand for?",
    "Tell me a short joke.",
]


def has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def matmul_flops(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    """FLOP/s of an n-by-n @ n-by-n GEMM: best of `reps` timed runs after a warm-up."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(dtype)
    b = torch.randn(n, n, generator=gen).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    torch.mm(a, b, out=out)
    seconds = best_of(lambda: torch.mm(a, b, out=out), reps)
    return 2 * n**3 / seconds


def read_bandwidth(mib: int = 256, reps: int = 5) -> float:
    """Bytes/s of one streaming read (a sum over a tensor far larger than the caches)."""
    data = torch.ones(mib << 18)
    return data.numel() * 4 / best_of(lambda: data.sum(), reps)


def gemm_step(loaded: LoadedModel, batch: int, reps: int = 5) -> float | None:
    """Seconds of one decode step's GEMMs alone (every layer's q|k|v, o, gate|up, down and the head)
    on the sampler's own packed weights at `batch` rows: the ceiling for the decode steps, since
    these GEMMs are the 2·params·batch FLOPs and everything else only adds time. None where the
    sampler does not take the packed path."""
    model: Any = loaded.model
    if not fast_path_applies(model):
        return None
    packed = PackedLlama(model, batch, packing_key(model, batch))
    linears = [linear for layer in packed.layers for linear in layer] + [packed.head]
    gen = torch.Generator().manual_seed(0)
    inputs = [
        torch.randn(batch, linear.weight.shape[1], generator=gen).to(linear.weight.dtype)
        for linear in linears
    ]

    def step() -> None:
        for linear, x in zip(linears, inputs, strict=True):
            linear(x)

    with torch.inference_mode():
        step()
        return best_of(step, reps)


def chat_prompts(loaded: LoadedModel, batch: int) -> list[list[int]]:
    prompts = []
    for i in range(batch):
        text = TOPICS[i % len(TOPICS)] + ("" if i < len(TOPICS) else " Be brief.")
        ids: Any = loaded.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        prompts.append([int(t) for t in ids])
    return prompts


def run_generate(loaded: LoadedModel, prompts: list[list[int]], max_tokens: int) -> int:
    """Plain `generate` with explicit sampling settings; returns the number of generated tokens."""
    width = max(len(p) for p in prompts)
    pad = loaded.tokenizer.pad_token_id if isinstance(loaded.tokenizer.pad_token_id, int) else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    model: Any = loaded.model
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            pad_token_id=pad,
        )
    return int(out[:, width:].numel())


def run_sampler(sampler: LocalSampler, prompts: list[list[int]], max_tokens: int) -> int:
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_tokens=max_tokens)
    requests = [SampleRequest(f"b{i}", tuple(p), params, 1000 + i) for i, p in enumerate(prompts)]
    return sum(len(s.token_ids) for s in sampler.sample(requests))


GEMM_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::linear",
        "aten::matmul",
        "mkl::_mkl_linear",
        "mkldnn::_linear_pointwise",
    }
)
REGIONS = ("norm", "rotary", "sampling")  # marked in the run itself; everything below them is theirs
PHASES = ("GEMM", "attention", *REGIONS, "other ops", "outside ops")


def phase_profile(sampler: LocalSampler, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    """Share of one sampler run's wall time in each of PHASES (see the module text)."""
    model: Any = sampler.model
    marked = [
        (m, "norm")
        for layer in model.model.layers
        for m in (layer.input_layernorm, layer.post_attention_layernorm)
    ]
    marked += [(model.model.norm, "norm"), (model.model.rotary_emb, "rotary")]
    handles = []
    for module, region in marked:
        handles.append(module.register_forward_pre_hook(_enter(region)))
        handles.append(module.register_forward_hook(_leave))
    choose = sampling_module.choose

    def marked_choose(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function("sampling"):
            return choose(*args, **kwargs)

    sampling_module.choose = marked_choose
    try:
        # The decode itself, on this thread: the sampler hands it to a thread of its own, which
        # the profiler (enabled per thread) would not see.
        params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_tokens=max_tokens)
        rows = [
            sampling_module._Row(
                SampleRequest(f"b{i}", tuple(p), params, 1000 + i), torch.Generator().manual_seed(1000 + i)
            )
            for i, p in enumerate(prompts)
        ]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            sampler._decode_in_turn(rows)
            wall_us = (time.perf_counter() - start) * 1e6
        assert sum(len(r.tokens) for r in rows) == len(prompts) * max_tokens
    finally:
        sampling_module.choose = choose
        for handle in handles:
            handle.remove()
    spent = dict.fromkeys(PHASES, 0.0)
    for event in prof.events():
        if event.name in REGIONS:
            continue
        spent[_phase_of(event)] += event.self_cpu_time_total
    spent["outside ops"] = max(0.0, wall_us - sum(spent.values()))
    return {phase: us / wall_us for phase, us in spent.items()}


def _phase_of(event: Any) -> str:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in REGIONS:
            return str(parent.name)
        parent = parent.cpu_parent
    if event.name in GEMM_OPS:
        return "GEMM"
    if "scaled_dot_product" in event.name or "flash_attention" in event.name:
        return "attention"
    return "other ops"


def _enter(region: str) -> Callable[..., None]:
    def hook(module: Any, args: Any) -> None:
        marks = module.__dict__.setdefault("_bench_marks", [])
        mark = torch.profiler.record_function(region)
        mark.__enter__()  # type: ignore[no-untyped-call]
        marks.append(mark)

    return hook


def _leave(module: Any, args: Any, output: Any) -> None:
    module.__dict__["_bench_marks"].pop().__exit__(None, None, None)


def bench_dtype(
    dtype: torch.dtype, args: argparse.Namespace, loaded: LoadedModel
) -> list[tuple[str, float, float]]:
    cast(torch.nn.Module, loaded.model).to(dtype)  # transformers' `to` wrapper hides torch's signature
    n_params = sum(p.numel() for p in loaded.model.parameters())
    flops = matmul_flops(dtype)
    bound = flops / (2 * n_params)
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    streaming = args.batch * read_bandwidth() / weight_bytes
    prompts = chat_prompts(loaded, args.batch)
    sampler = LocalSampler.from_loaded(loaded)
    sampler.stop_strings, sampler.stop_ids = (), frozenset()  # every row runs to max_tokens
    name = str(dtype).removeprefix("torch.")
    print(
        f"[{name}] params {n_params / 1e6:.1f}M, matmul {flops / 1e9:.0f} GFLOP/s, "
        f"bound {bound:.0f} tok/s, threads {torch.get_num_threads()}"
    )
    print(
        f"  (memory: reading the weights once per step at the measured bandwidth caps batch "
        f"{args.batch} at {streaming:.0f} tok/s, ratio {streaming / bound:.2f} of the compute bound)"
    )
    gemms = gemm_step(loaded, args.batch)
    if gemms is not None:
        print(
            f"  (GEMMs alone: the decode step's GEMMs on the packed weights take {gemms * 1e3:.1f} ms "
            f"at batch {args.batch}, {args.batch / gemms:.0f} tok/s, ratio {args.batch / gemms / bound:.2f} "
            f"of the compute bound: the ceiling for decode)"
        )
    rows: list[tuple[str, float, float]] = []
    tokens = args.batch * args.max_tokens
    runs: list[tuple[str, Callable[[], int]]] = [
        ("generate", lambda: run_generate(loaded, prompts, args.max_tokens)),
        ("LocalSampler", lambda: run_sampler(sampler, prompts, args.max_tokens)),
    ]
    for label, fn in runs:
        assert fn() == tokens, f"{label} stopped early"  # warm-up, and the token count check
        seconds = best_of(fn, args.repeat)
        rows.append((f"{label} {name}", tokens / seconds, tokens / seconds / bound))
        print(f"  {label:<13} {seconds:7.2f} s  {tokens / seconds:8.1f} tok/s  ratio {rows[-1][2]:.3f}")
    shares = phase_profile(sampler, prompts, args.max_tokens)
    print(
        "  LocalSampler time by phase (one profiled run): "
        + ", ".join(f"{p} {shares[p]:.0%}" for p in PHASES)
    )
    prefill = best_of(lambda: run_sampler(sampler, prompts, 1), args.repeat)
    total = tokens / rows[-1][1]
    print(
        f"  LocalSampler split: prefill+first token {prefill:.2f} s, decode {total - prefill:.2f} s "
        f"({(tokens - args.batch) / (total - prefill):.1f} tok/s, "
        f"ratio {(tokens - args.batch) / (total - prefill) / bound:.3f})"
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="rows decoded together")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens generated per row")
    parser.add_argument("--dtype", choices=["both", "float32", "bfloat16"], default="both")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per figure (best is kept)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--quick", action="store_true", help="the tiny test model: a smoke run")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = tiny_model(0) if args.quick else load_base()
    dtypes = {"float32": [torch.float32], "bfloat16": [torch.bfloat16]}.get(
        args.dtype, [torch.float32] + ([torch.bfloat16] if has_native_bf16() else [])
    )
    if torch.bfloat16 in dtypes and not has_native_bf16():
        print("note: this CPU has no native bf16; bfloat16 figures are emulated")
    rows: list[tuple[str, float, float]] = []
    for dtype in dtypes:
        rows += bench_dtype(dtype, args, loaded)
    print(f"\n{'path':<22} {'tok/s':>9} {'ratio':>7}")
    for label, rate, ratio in rows:
        print(f"{label:<22} {rate:>9.1f} {ratio:>7.3f}")
    for label, rate, ratio in rows:
        if label.startswith("LocalSampler"):
            name = label.split()[-1]
            print(
                f"decode tok/s at batch {args.batch}: {rate:.1f} (ratio {ratio:.2f} of the compute bound; "
                f"target >= {TARGETS[name]:.2f}) [{name}]"
            )


if __name__ == "__main__":
    main()
