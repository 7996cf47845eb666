"""A process's first parallel `cos` (the first rotary embedding) computes what every later one does."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from reprorl.policy import vector_math
from reprorl.policy.vector_math import FUNCTIONS, resolve_vector_math

pytestmark = pytest.mark.slow

# The first forward pass's rotary embedding: 660 positions x 32 dims, cos over two torch threads.
PROBE = """
import hashlib, sys, torch
torch.set_num_threads(2)
if sys.argv[1] == "resolve":  # the module alone: the package's import costs seconds a probe
    import importlib.util
    spec = importlib.util.spec_from_file_location("vector_math", sys.argv[2])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.resolve_vector_math()
elif sys.argv[1] == "warm":
    torch.ones(64).cos()
positions = torch.arange(660)[:, None].float()
freqs = positions / (10000 ** (torch.arange(0, 32, 2).float() / 32))
angles = torch.cat((freqs, freqs), dim=-1)
print(hashlib.sha256(angles.cos().numpy().tobytes()).hexdigest())
"""
SPIN = "while True:\n    pass\n"


def _first_cos(mode: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode, vector_math.__file__],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


def test_importing_the_policy_layer_resolves_every_function_once_per_precision() -> None:
    assert resolve_vector_math.cache_info().currsize == 1  # called as reprorl.policy was imported
    assert resolve_vector_math() == 2 * len(FUNCTIONS)


def test_a_first_parallel_cos_under_load_is_the_same_in_every_process() -> None:
    """MKL picks a function's code path on its first call; two threads making that call at once, on
    a loaded machine, sometimes get another path (6 processes in 40 measured). Resolved first, the
    choice is made in one thread before."""
    settled = _first_cos("warm")  # computed once in one thread first: the path every later call takes
    spinner = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        seen = Counter(_first_cos("resolve") for _ in range(30))
    finally:
        spinner.kill()
        spinner.wait()
    assert seen == {settled: 30}
