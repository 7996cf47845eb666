"""Intel MKL's vector math functions, resolved once in one thread before any parallel region uses them.

torch computes `cos`, `sin`, `exp`, `log`, `tanh`, `sqrt` and a few others of float32 and float64
tensors with MKL's vector math library, split over the intra-op threads. MKL picks each function's
code path on its first call in the process; when that first call is made by several threads at once
(the first rotary embedding of the first forward pass), one of them can run another path, whose
results differ in the last bit. Which one depends on how the threads were scheduled: the same batch
then samples logprobs that differ by about 1e-6 from one process to the next (seen in one resume in
fifteen, on a machine under load). Calling each function once on a short tensor, in the importing
thread, makes that choice before any parallel use.
"""

from __future__ import annotations

import functools

import torch

# The functions torch hands to MKL (ATen/cpu/vml.h, IMPLEMENT_VML_MKL), for both precisions.
FUNCTIONS = (
    "acos",
    "asin",
    "atan",
    "cos",
    "erf",
    "erfc",
    "erfinv",
    "exp",
    "log",
    "log10",
    "log2",
    "sin",
    "sqrt",
    "tan",
    "tanh",
    "trunc",
)
# Shorter than torch's grain for these kernels (2048): the call runs in this thread alone.
LENGTH = 64


@functools.cache
def resolve_vector_math() -> int:
    """Call each function once per precision in this thread; how many calls were made."""
    calls = 0
    with torch.inference_mode():
        for dtype in (torch.float32, torch.float64):
            x = torch.linspace(0.1, 0.9, LENGTH, dtype=dtype)
            for name in FUNCTIONS:
                getattr(torch, name)(x)
                calls += 1
    return calls
