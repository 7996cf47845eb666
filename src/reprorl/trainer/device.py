"""The device a trainer runs on, the determinism settings it runs under, and what the record says of both.

A trainer trains on CUDA when a GPU is there and on the CPU otherwise (`reprorl.hardware`), in
float32 master weights under the autocast precision `model.train_dtype` names. On CUDA, bit-reproducible runs
need deterministic kernels and a fixed cuBLAS workspace (`CUBLAS_WORKSPACE_CONFIG`, read when cuBLAS
starts, so it is set before the first CUDA matmul): `deterministic=True` asks for both, at a cost in
speed the record names. CPU runs are deterministic for a fixed thread count without either.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from reprorl.hardware import DEVICE_ENV as DEVICE_ENV
from reprorl.hardware import pick_device as pick_device

CUBLAS_WORKSPACE = ":4096:8"


def make_deterministic(device: torch.device) -> dict[str, Any]:
    """Deterministic kernels on CUDA (and the cuBLAS workspace they need); what was set."""
    if device.type != "cuda":
        return {"deterministic": True, "why": "CPU kernels are deterministic for a fixed thread count"}
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    return {
        "deterministic": True,
        "use_deterministic_algorithms": True,
        "cublas_workspace_config": os.environ["CUBLAS_WORKSPACE_CONFIG"],
        "cudnn_benchmark": False,
        "cost": "deterministic kernels are slower (scatter/index ops, some attention backends)",
    }


def matmul_rate(device: torch.device, dtype: torch.dtype, n: int = 2048, reps: int = 3) -> float:
    """FLOP/s of an n x n by n x n GEMM on `device` in `dtype`: the fastest of `reps` after a warm-up.
    The hardware bound an update's FLOPs are held against, measured where and when the run trains
    (the same machine under other load gives another figure)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    best = float("inf")
    for rep in range(reps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if rep:  # the first is the warm-up
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def device_info(device: torch.device, *, autocast_bf16: bool) -> dict[str, Any]:
    """What the run record says of where training ran, with its matmul rate in the compute dtype."""
    compute = torch.bfloat16 if autocast_bf16 else torch.float32
    info: dict[str, Any] = {
        "device": device.type,
        "master_dtype": "float32",
        "compute_dtype": "bfloat16" if autocast_bf16 else "float32",
        "torch": torch.__version__,
        "matmul_flops_per_s": matmul_rate(device, compute),
    }
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        info |= {
            "gpu": torch.cuda.get_device_name(index),
            "capability": f"{major}.{minor}",
            "gpu_memory_bytes": torch.cuda.get_device_properties(index).total_memory,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),  # type: ignore[no-untyped-call]
            "gpu_count": torch.cuda.device_count(),
        }
    else:
        info["threads"] = torch.get_num_threads()
    return info
