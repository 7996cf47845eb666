"""A grammar-based fuzz of the tool-call format: 10,000 model outputs built from a grammar of JSON
with the values a record cannot hold exactly (NaN, infinities, numbers past float range, lone
surrogates, keys given twice, names with line breaks) mixed among valid ones. Parsing never raises,
and every call it accepts serialises into a record that reads back as exactly what will run."""

from __future__ import annotations

import json
import math
import random

from reprorl.actions import CLOSE, OPEN, parse_action
from reprorl.types import ToolCall, Turn

OUTPUTS = 10_000
NAMES = [
    "calc",
    "sql_query",
    "files.read",
    "ask-human",
    "_x",
    "calc\n",
    "calc\r\n",
    " calc",
    "calc\u2028",
    "ca lc",
    "ü",
]
STRINGS = [
    '"plain"',
    '"naïve ∑ 🙂"',
    '"line\\nbreak"',
    '"\\u2028"',
    '"\\ud83d\\ude00"',
    '"\\ud800"',
    '"\\udfff x"',
    '""',
    '"\\"q\\""',
]
NUMBERS = [
    "0",
    "-7",
    "3.25",
    "1e-300",
    "123456789012345678901234567890",
    "-0.0",
    "1e400",
    "-1e999",
    "NaN",
    "Infinity",
    "-Infinity",
]


class Grammar:
    """Random JSON text of bounded depth; `hazards` says what the text holds that a record cannot."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def value(self, depth: int) -> str:
        roll = self.rng.random()
        if depth <= 0 or roll < 0.35:
            return self.rng.choice(NUMBERS)
        if roll < 0.6:
            return self.rng.choice(STRINGS)
        if roll < 0.7:
            return self.rng.choice(["true", "false", "null"])
        if roll < 0.85:
            return "[" + ", ".join(self.value(depth - 1) for _ in range(self.rng.randrange(4))) + "]"
        return self.obj(depth - 1)

    def obj(self, depth: int) -> str:
        keys = [
            self.rng.choice(['"a"', '"b"', '"expression"', '"\\ud800"', '"k\\u00e9"'])
            for _ in range(self.rng.randrange(4))
        ]
        return "{" + ", ".join(f"{k}: {self.value(depth)}" for k in keys) + "}"

    def call(self) -> str:
        arguments = self.obj(3)
        if self.rng.random() < 0.15:
            arguments = json.dumps(arguments)  # double-encoded, as some models write them
        fields = [f'"name": {json.dumps(self.rng.choice(NAMES))}', f'"arguments": {arguments}']
        if self.rng.random() < 0.05:
            fields.append('"name": "other"')
        self.rng.shuffle(fields)
        body = "{" + ", ".join(fields) + "}"
        return OPEN + body + (CLOSE if self.rng.random() > 0.03 else "")

    def output(self) -> str:
        parts = [self.rng.choice(["", "Let me compute. ", "ok\n", "é "])]
        for _ in range(self.rng.randrange(4)):
            parts.append(self.call())
            parts.append(self.rng.choice(["", " ", "\nthen "]))
        return "".join(parts)


def _reference(text: str) -> object:
    """The call as Python's own JSON reads it, last key winning: what would run without the checks."""
    return json.loads(text)


def _holds_only_exact_values(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(_holds_only_exact_values(k) and _holds_only_exact_values(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_holds_only_exact_values(v) for v in value)
    return True


def _has_duplicate_keys(text: str) -> bool:
    found = False

    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        nonlocal found
        keys = [k for k, _ in pairs]
        found = found or len(keys) != len(set(keys))
        return dict(pairs)

    json.loads(text, object_pairs_hook=hook)
    return found


def test_ten_thousand_grammar_outputs_parse_into_exact_records() -> None:
    grammar = Grammar(random.Random(20261204))
    accepted = refused = 0
    for n in range(OUTPUTS):
        text = grammar.output()
        action = parse_action(text, turn_id=f"t{n}")  # never raises
        attempts = text.count(OPEN)
        assert len(action.tool_calls) + len(action.parse_errors) >= min(attempts, 1), text
        bodies = [part.split(CLOSE, 1)[0].strip() for part in text.split(OPEN)[1:] if CLOSE in part]
        by_id = {}
        for index, body in enumerate(bodies):
            by_id[f"t{n}.{index}"] = body
        for call in action.tool_calls:
            accepted += 1
            body = by_id[call.id]
            assert not _has_duplicate_keys(body), body
            reference = _reference(body)
            assert isinstance(reference, dict)
            arguments = reference["arguments"]
            if isinstance(arguments, str):
                assert not _has_duplicate_keys(arguments), arguments
                arguments = json.loads(arguments)
            assert call.name == reference["name"] and call.name == call.name.strip()
            assert _holds_only_exact_values(call.arguments), call.arguments
            assert call.arguments == arguments  # the record holds what the tool will be given
            # ... and it survives being written and read back, in a call and in a whole turn.
            assert ToolCall.model_validate_json(call.model_dump_json()) == call
            turn = Turn(index=0, text=text, tool_calls=(call,))
            assert Turn.model_validate_json(turn.model_dump_json()).tool_calls == (call,)
        refused += len(action.parse_errors)
    # The mix exercises both sides: many calls accepted, many refused.
    assert accepted > 2_000 and refused > 2_000, (accepted, refused)
