"""Fuzzed model outputs for the tool-call parsers: random bytes, cut-off calls, fragments of the
format, and calls with oversized names and arguments, in a fixed mix from a seed."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

from reprorl.actions import CLOSE, OPEN, render_call

FRAGMENTS = [
    OPEN,
    CLOSE,
    "{",
    "}",
    "[",
    "]",
    '"name"',
    '"arguments"',
    ":",
    ",",
    '"calc"',
    "null",
    "\x00",
    "é",
    "1e999",
]


def _fragments(rng: random.Random) -> str:
    return "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 40)))


def model_outputs(count: int, seed: int) -> Iterator[str]:
    """`count` outputs, a quarter of each kind, the same for the same seed."""
    rng = random.Random(seed)
    for i in range(count):
        kind = i % 4
        if kind == 0:
            yield rng.randbytes(rng.randint(0, 300)).decode("utf-8", "replace")
        elif kind == 1:
            full = render_call("calc", {"expression": "1+" * rng.randint(0, 50) + "1"})
            yield full[: rng.randint(0, len(full))]
        elif kind == 2:
            yield _fragments(rng)
        else:
            call = {"name": "x" * rng.randint(0, 80), "arguments": {"a": "b" * rng.randint(0, 9000)}}
            yield OPEN + json.dumps(call) + CLOSE
