"""The action format: how a model's text becomes tool calls, and what counts as unparsable.

A model calls tools by writing JSON objects inside tags, one call per tag pair:

    <tool_call>{"name": "calc", "arguments": {"expression": "17 * 23"}}</tool_call>

A reply with no `<tool_call>` tag is a final answer. Anything else that looks like an attempt
(an unclosed tag, invalid JSON, a missing name, arguments that are not an object, nested tags)
is a parse error: it is reported back to the model and recorded, never raised.

The JSON is read strictly, so that the record holds exactly what ran: a number JSON cannot carry
(`NaN`, `Infinity`, or one too large for a float, which would be recorded as null), a string with a
lone surrogate (which no record can serialise) and a key given twice (the call would show one value
and run the other) are each a parse error.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from reprorl.types import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALLS = 16
MAX_CALL_CHARS = 65_536
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")  # matched whole: `$` would allow a trailing newline


class _Refused(ValueError):
    """A JSON value the strict reader refuses; its message says which."""


def _no_constant(name: str) -> object:
    raise _Refused(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Refused(f"{text[:40]} is too large for a number")
    return value


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"key {key[:40]!r} appears twice")
        out[key] = value
    return out


def _check_text(value: object) -> None:
    """Refuse a string (key or value, at any depth) that is not valid Unicode text (a lone surrogate)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise _Refused("a string holds a lone surrogate (\\ud800-\\udfff)") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def strict_json(text: str) -> object:
    """`json.loads`, refusing non-finite numbers, duplicate keys and lone surrogates (`ValueError`)."""
    value = json.loads(text, parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_unique)
    _check_text(value)
    return value


@dataclass(frozen=True)
class Action:
    """What the model did in one turn: its text, the calls it made, and what could not be parsed."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    parse_errors: tuple[str, ...] = field(default=())

    @property
    def is_final(self) -> bool:
        """A reply with neither calls nor call attempts is the model's answer."""
        return not self.tool_calls and not self.parse_errors

    @property
    def answer(self) -> str:
        return self.text.strip()


def _parse_one(body: str, index: int, turn_id: str) -> ToolCall | str:
    if len(body) > MAX_CALL_CHARS:
        return f"tool call {index + 1} is longer than {MAX_CALL_CHARS} characters"
    if OPEN in body:
        return f"tool call {index + 1} contains a nested {OPEN} tag"
    try:
        value = strict_json(body)
    except _Refused as exc:
        return f"tool call {index + 1} is refused: {exc}"
    except (ValueError, RecursionError) as exc:
        return f"tool call {index + 1} is not valid JSON: {str(exc)[:120]}"
    if not isinstance(value, dict):
        return f"tool call {index + 1} must be a JSON object with 'name' and 'arguments'"
    name = value.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return f"tool call {index + 1} needs a 'name' string naming a tool"
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models double-encode arguments
        try:
            arguments = strict_json(arguments)
        except _Refused as exc:
            return f"tool call {index + 1}: 'arguments' is refused: {exc}"
        except (ValueError, RecursionError):
            return f"tool call {index + 1}: 'arguments' is a string that is not a JSON object"
    if not isinstance(arguments, dict):
        return f"tool call {index + 1}: 'arguments' must be a JSON object"
    extra = set(value) - {"name", "arguments", "id"}
    if extra:
        return f"tool call {index + 1} has unexpected keys {sorted(extra)}"
    try:
        return ToolCall(id=f"{turn_id}.{index}", name=name, arguments=arguments)
    except ValueError as exc:
        return f"tool call {index + 1} has arguments that are not JSON values: {str(exc)[:120]}"


def parse_action(text: str, *, turn_id: str = "call") -> Action:
    """Split a model reply into tool calls and parse errors; never raises."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    position = 0
    index = 0
    while True:
        start = text.find(OPEN, position)
        stray_close = text.find(CLOSE, position)
        if stray_close != -1 and (start == -1 or stray_close < start):
            errors.append(f"found {CLOSE} without a matching {OPEN}")
            position = stray_close + len(CLOSE)
            continue
        if start == -1:
            break
        end = text.find(CLOSE, start + len(OPEN))
        if end == -1:
            errors.append(f"tool call {index + 1} has {OPEN} but no closing {CLOSE}")
            break
        if index >= MAX_CALLS:
            errors.append(f"more than {MAX_CALLS} tool calls in one reply")
            break
        parsed = _parse_one(text[start + len(OPEN) : end].strip(), index, turn_id)
        if isinstance(parsed, str):
            errors.append(parsed)
        else:
            calls.append(parsed)
        index += 1
        position = end + len(CLOSE)
    return Action(text=text, tool_calls=tuple(calls), parse_errors=tuple(errors))


def render_call(name: str, arguments: dict[str, object]) -> str:
    """The text a model writes to make one call (used by scripted policies and SFT demos)."""
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{CLOSE}"
