"""The GPU check: a few steps of SmolLM2 with vLLM sampling and CUDA training, against the GPU's own bound.

One script, under 8 minutes on one GPU. It registers the bundled SmolLM2-135M-Instruct and the
calculator task sets in a scratch store, runs `--steps` LoRA steps with `model.vllm` (one vLLM
server reprorl starts, from `REPRORL_VLLM_PYTHON` or this interpreter) and the trainer on CUDA,
then prints from the run's own records:

- sampling tokens/s (completion tokens over the rollout phase) and training tokens/s;
- the step time split (rollouts vs training);
- the trainer's share of the GPU's bf16 peak: 4·params·tokens FLOPs per step (forward, and the
  backward through the frozen base to the adapter) over train seconds, against a bf16 GEMM
  measured on the same GPU in the same run;
- the vLLM-vs-trainer mismatch (`train/mismatch_k3`, per step).

    REPRORL_VLLM_PYTHON=/path/to/venv/bin/python python bench/gpu.py [--steps 4] [--group 8]

Without CUDA it says so and exits 2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import torch

from reprorl.cli.main import main as cli
from reprorl.policy import load_base
from reprorl.store import Store, find_run

SPEC = """
name = "gpu-check"
seed = 0
[model]
owner = "bench@reprorl"
base = "smollm2-135m-instruct"
adapter = {{ kind = "lora", rank = 16, alpha = 32.0 }}
sampling_dtype = "bfloat16"
[model.vllm]
max_model_len = 4096
memory_fraction = 0.5
[data]
owner = "bench@reprorl"
train = "calc-train"
[learning]
owner = "bench@reprorl"
steps = {steps}
lr = 1e-4
group_size = {group}
tasks_per_step = {tasks}
max_tokens = 256
max_turns = 4
[evaluation]
owner = "bench@reprorl"
suites = ["calc-eval"]
every_steps = 1000
"""


def bf16_peak(n: int = 8192, reps: int = 10) -> float:
    """FLOP/s of a bf16 n x n GEMM on the GPU, best of `reps` after a warm-up."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    torch.mm(a, b)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--group", type=int, default=8, help="rollouts per task")
    parser.add_argument("--tasks", type=int, default=8, help="tasks per step")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this is the GPU check (bench/vllm_cpu.py is the CPU one)")
        return 2
    peak = bf16_peak()
    print(f"{torch.cuda.get_device_name()}: bf16 GEMM {peak / 1e12:.1f} TFLOP/s (measured)")
    params = sum(p.numel() for p in load_base().model.parameters())
    with tempfile.TemporaryDirectory(prefix="reprorl-gpu-check-") as scratch:
        home = Path(scratch) / "home"
        store = Store(home)
        for name in ("calc-train", "calc-eval"):
            with resources.as_file(resources.files("reprorl") / "examples" / f"{name}.jsonl") as path:
                store.add(name, path, kind="taskset")
        spec = Path(scratch) / "spec.toml"
        spec.write_text(SPEC.format(steps=args.steps, group=args.group, tasks=args.tasks))
        started = time.perf_counter()
        code = cli(["--home", str(home), "run", str(spec)])
        wall = time.perf_counter() - started
        if code != 0:
            print(f"the run failed (exit {code})")
            return 1
        (run_id,) = [p.name for p in (home / "runs").iterdir() if not p.name.startswith(".")]
        record = find_run(store, run_id)
        steps = [m for m in record.metrics().records if m.get("stage") is None and "train_s" in m]
        device = [e for e in record.events().records if e.get("event") == "trainer_device"]
    sample_s = sum(m["rollout_s"] for m in steps)
    train_s = sum(m["train_s"] for m in steps)
    sampled = sum(m["completion_tokens"] for m in steps)
    trained = sum(m["train/tokens"] for m in steps)
    flops = 4 * params * trained
    print(
        f"trainer on {device[0].get('gpu') if device else '?'}; run wall {wall:.0f} s for {len(steps)} steps"
    )
    print(f"sampling (vLLM): {sampled / sample_s:.0f} tok/s over {sample_s:.1f} s")
    print(f"training: {trained / train_s:.0f} tok/s over {train_s:.1f} s")
    total = sample_s + train_s
    print(f"step split: rollouts {sample_s / total:.0%}, training {train_s / total:.0%}")
    print(f"trainer share of the bf16 peak: {flops / train_s / peak:.3f}")
    mismatch = [m["train/mismatch_k3"] for m in steps if "train/mismatch_k3" in m]
    if mismatch:
        print(
            f"vLLM vs trainer mismatch_k3 per step: {', '.join(f'{x:.2e}' for x in mismatch)} "
            f"(mean {statistics.fmean(mismatch):.2e})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
