"""Matching a free-text final answer: numbers by value, names as whole words with no rival named."""

from __future__ import annotations

import math
import re

from reprorl.rewards.verifiers.numeric import last_number


def mentions(text: str, name: str) -> bool:
    """`name` appears in `text` as whole words, ignoring case."""
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.IGNORECASE) is not None


def answer_matches(answer: str, expected: object, distractors: list[str]) -> bool:
    """Numbers: the answer's last number equals the expected one. Names: the expected name is given and
    no other candidate is (listing every candidate must not pass)."""
    if isinstance(expected, int | float) and not isinstance(expected, bool):
        given = last_number(answer)
        return given is not None and math.isclose(given, float(expected), rel_tol=0.0, abs_tol=1e-9)
    return mentions(answer, str(expected)) and not any(mentions(answer, d) for d in distractors)
