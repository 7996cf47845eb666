"""The hardware this process computes on: the device (CUDA or the CPU) and the precision "auto" picks there.

A trainer and an in-process sampler run on CUDA when a GPU is there and on the CPU otherwise;
`REPRORL_DEVICE=cpu` keeps them on the CPU beside a GPU. A spec's precision fields
(`model.sampling_dtype`, `model.train_dtype`) may say "auto": bfloat16 where matmuls run faster in
it (a CUDA device that has it, a CPU with AMX tiles), float32 elsewhere — a CPU without AMX runs
bfloat16 matmuls through AVX-512 at about half its float32 rate (116-169 against ~300 GFLOP/s on
the 2-core box docs/training.md measures). The choice is a function of the machine, never of a
timing, so two runs of one spec on one machine compute alike; a spec is pinned to it when
resolved, and the run's `spec.json` says what ran.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

from reprorl.errors import UserInputError

if TYPE_CHECKING:
    import torch

DEVICE_ENV = "REPRORL_DEVICE"
Dtype = Literal["float32", "bfloat16"]


def pick_device() -> torch.device:
    """CUDA when present (unless `REPRORL_DEVICE=cpu`), else the CPU."""
    import torch

    asked = os.environ.get(DEVICE_ENV, "").strip().lower()
    if asked not in ("", "cpu", "cuda"):
        raise UserInputError(f"{DEVICE_ENV}={asked!r}: use 'cpu' or 'cuda'")
    if asked == "cuda" and not torch.cuda.is_available():
        raise UserInputError(f"{DEVICE_ENV}=cuda but torch sees no CUDA device ({torch.__version__})")
    if asked == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


def auto_dtype() -> tuple[Dtype, str]:
    """The precision "auto" stands for on this machine, and why."""
    import torch

    if pick_device().type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bfloat16", f"{torch.cuda.get_device_name()} computes bfloat16 natively"
        return "float32", f"{torch.cuda.get_device_name()} has no native bfloat16"
    if torch.cpu._is_amx_tile_supported():
        return "bfloat16", "the CPU has AMX tiles: bfloat16 matmuls outrun float32"
    return "float32", "the CPU has no AMX tiles: float32 matmuls outrun bfloat16"


def resolve_dtype(asked: str) -> Dtype:
    """`asked` as a concrete precision: itself, or what "auto" picks here."""
    if asked == "auto":
        return auto_dtype()[0]
    if asked not in ("float32", "bfloat16"):
        raise ValueError(f"precision {asked!r}: use 'auto', 'float32' or 'bfloat16'")
    return "float32" if asked == "float32" else "bfloat16"
