"""Reading a judge's reply: a score in [0, 1] and its rationale, from a JSON object or plain text.

A reply that holds no readable score, a score outside [0, 1], or no text at all is a `Verdict` with
a failure class instead of a score; the judge records it and goes on.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Literal

JudgeFailure = Literal["parse_error", "out_of_range", "empty_reply", "infra_error"]
MAX_RATIONALE = 500


@dataclass(frozen=True)
class Verdict:
    """What a reply says: a score and why, or why no score could be read from it."""

    score: float | None = None
    rationale: str = ""
    failure: JudgeFailure | None = None
    error: str | None = None


_SCORE_RE = re.compile(
    r"\bscore\b[\s*_\"']*(?:is|of|=|:)?[\s*_\"']*(-?\d+(?:\.\d+)?)(?:\s*/\s*(\d+(?:\.\d+)?))?", re.IGNORECASE
)
_RATIONALE_RE = re.compile(r"\b(?:rationale|reason|explanation)\b[\s*_\"']*[:=][\s*_\"']*(.+)", re.I)


def parse_verdict(text: str) -> Verdict:
    """Read a score in [0, 1] and a rationale from a reply: a JSON object, else `score: x` (or `x/10`)."""
    if not text.strip():
        return Verdict(failure="empty_reply", error="the judge replied with no text")
    found = _json_verdict(text)
    if found is None:
        found = _text_verdict(text)
    if found is None:
        return Verdict(failure="parse_error", error="no score in the reply")
    value, rationale = found
    if value is None:
        return Verdict(failure="parse_error", error="the score is not a number")
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return Verdict(failure="out_of_range", error=f"score {value} is outside [0, 1]")
    return Verdict(score=value, rationale=short(rationale))


def last_json_object(text: str, key: str) -> dict[str, object] | None:
    """The last JSON object in the text that has `key` (thinking models answer last), keys lowercased."""
    decoder = json.JSONDecoder(strict=False)  # models put raw newlines inside JSON strings
    found: dict[str, object] | None = None
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict):
            fields = {str(k).lower(): v for k, v in value.items()}
            found = fields if key in fields else found
    return found


def rationale_of(fields: dict[str, object]) -> str:
    """The reply's reason, under whichever of the usual keys it came."""
    why = next((fields[k] for k in ("rationale", "reason", "explanation") if k in fields), "")
    return why if isinstance(why, str) else json.dumps(why)


def _json_verdict(text: str) -> tuple[float | None, str] | None:
    fields = last_json_object(text, "score")
    return None if fields is None else (_number(fields["score"]), rationale_of(fields))


def _text_verdict(text: str) -> tuple[float | None, str] | None:
    matches = list(_SCORE_RE.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    value = float(last.group(1))
    if last.group(2) is not None:
        scale = float(last.group(2))
        value = value / scale if scale > 0 else math.nan
    why = _RATIONALE_RE.search(text)
    rationale = why.group(1) if why else text[: last.start()] + text[last.end() :]
    return value, rationale


def _number(value: object) -> float | None:
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def short(text: str) -> str:
    """One line of at most MAX_RATIONALE characters."""
    flat = " ".join(text.split()).strip(" \"'*")
    return flat if len(flat) <= MAX_RATIONALE else flat[: MAX_RATIONALE - 1] + "…"
