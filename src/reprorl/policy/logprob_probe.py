"""Which logprobs a completions server returns: after temperature (what the trainer scores) or raw.

The trainer computes each sampled token's logprob under the temperature-scaled distribution, and
the loss's importance weights compare it with the sampler's. `LocalSampler` and `reprorl serve
policy` report that distribution; vLLM reports it only when started with `--logprobs-mode
processed_logprobs` (its default, `raw_logprobs`, is the unscaled one). A server cannot be asked
which it does, so it is shown: the same prompt, one token at temperature 1 and at 0.5, with the
five likeliest tokens' logprobs. Raw logprobs are the same at both; scaled ones are not (at 0.5 a
token's logprob is about twice its distance from the likeliest's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

from reprorl.errors import InferenceError, UserInputError
from reprorl.policy.transport import Reply

LogprobsMode = Literal["processed", "raw", "unknown"]
PROBE_PROMPT = "The three primary colours are"
PROBE_TOP = 5
# Raw logprobs of one prompt agree across requests to within a kernel's rounding; scaled ones at
# temperatures 1 and 0.5 differ by about the gap between a token and the likeliest (nats).
SAME_WITHIN = 1e-2


def _top(reply: Reply) -> dict[str, float] | None:
    """The first sampled position's top logprobs, token -> logprob; None if the reply has none."""
    choices = reply.body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    logprobs = choices[0].get("logprobs")
    top = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(top, list) or not top or not isinstance(top[0], dict):
        return None
    out = {str(k): float(v) for k, v in top[0].items() if isinstance(v, int | float)}
    return {k: v for k, v in out.items() if math.isfinite(v)} or None


def probe_logprobs(post: Callable[[dict[str, Any]], Reply], model: str) -> LogprobsMode:
    """Ask the server behind `post` (a `/completions` poster) twice and tell which logprobs it returns.

    "unknown" when it gives no top logprobs, too few tokens in common, or a distribution so sure of
    one token that scaling cannot show (every other token below the float's range).
    """
    tops = []
    for temperature in (1.0, 0.5):
        body = {
            "model": model,
            "prompt": PROBE_PROMPT,
            "max_tokens": 1,
            "temperature": temperature,
            "seed": 0,
            "n": 1,
            "logprobs": PROBE_TOP,
        }
        try:
            top = _top(post(body))
        except InferenceError:
            return "unknown"
        if top is None:
            return "unknown"
        tops.append(top)
    shared = set(tops[0]) & set(tops[1])
    if len(shared) < 2:
        return "unknown"
    gap = max(abs(tops[0][t] - tops[1][t]) for t in shared)
    return "raw" if gap <= SAME_WITHIN else "processed"


def check_logprobs(mode: LogprobsMode, temperature: float, *, where: str, field: str) -> None:
    """Refuse raw logprobs where they differ from the trainer's: any temperature but 0 and 1."""
    if mode == "raw" and temperature not in (0.0, 1.0):
        raise UserInputError(
            f"{where} returns logprobs before temperature, but the trainer scores tokens at "
            f"learning.temperature = {temperature}: start vLLM with --logprobs-mode processed_logprobs "
            "(docs/scaling.md), or set learning.temperature = 1.0",
            field=field,
        )
