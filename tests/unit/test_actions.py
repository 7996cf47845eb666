"""The tool-call text format: well-formed calls parse, everything else is a classified parse error."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzzed_outputs import model_outputs
from reprorl.actions import CLOSE, MAX_CALLS, OPEN, parse_action, render_call


def test_plain_text_is_a_final_answer() -> None:
    action = parse_action("The answer is 42.")
    assert action.is_final and action.answer == "The answer is 42." and action.tool_calls == ()


def test_calls_parse_with_ids_in_order() -> None:
    text = "thinking " + render_call("calc", {"expression": "2+2"}) + " and " + render_call("ls", {})
    action = parse_action(text, turn_id="r1.0")
    assert [c.name for c in action.tool_calls] == ["calc", "ls"]
    assert [c.id for c in action.tool_calls] == ["r1.0.0", "r1.0.1"]
    assert action.tool_calls[0].arguments == {"expression": "2+2"}
    assert not action.is_final and action.parse_errors == ()


def test_double_encoded_arguments_are_accepted() -> None:
    body = json.dumps({"name": "calc", "arguments": json.dumps({"expression": "1"})})
    assert parse_action(f"{OPEN}{body}{CLOSE}").tool_calls[0].arguments == {"expression": "1"}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (f"{OPEN}{{'name': 'calc'}}{CLOSE}", "not valid JSON"),
        (f'{OPEN}{{"name": "calc"', "no closing"),
        (f"{OPEN}[1, 2]{CLOSE}", "JSON object"),
        (f'{OPEN}{{"arguments": {{}}}}{CLOSE}', "'name'"),
        (f'{OPEN}{{"name": "calc", "arguments": [1]}}{CLOSE}', "'arguments' must be"),
        (f'{OPEN}{{"name": "calc", "arguments": "nope"}}{CLOSE}', "string that is not"),
        (f'{OPEN}{{"name": "bad name!", "arguments": {{}}}}{CLOSE}', "'name'"),
        (f'{OPEN}{{"name": "calc", "arguments": {{}}, "x": 1}}{CLOSE}', "unexpected keys"),
        (f'{OPEN}{OPEN}{{"name": "calc"}}{CLOSE}{CLOSE}', "nested"),
        (f"stray {CLOSE}", "without a matching"),
        (OPEN + "[" * 100_000 + CLOSE, "longer than"),
        (OPEN + "[" * 5000 + "]" * 5000 + CLOSE, "not valid JSON"),
    ],
)
def test_malformed_calls_are_parse_errors(text: str, needle: str) -> None:
    action = parse_action(text)
    assert action.parse_errors and needle in action.parse_errors[0]
    assert not action.is_final


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [
        ('{"x": NaN}', "NaN is not a JSON number"),
        ('{"x": Infinity}', "Infinity is not"),
        ('{"x": -Infinity}', "-Infinity is not"),
        ('{"x": [1, {"y": 1e400}]}', "too large"),
        ('{"x": -1e999}', "too large"),
        ('{"x": "\\ud800"}', "lone surrogate"),
        ('{"\\udfff": 1}', "lone surrogate"),
        ('{"x": ["ok", "\\udbff\\u0041"]}', "lone surrogate"),
        ('{"x": 1, "x": 2}', "appears twice"),
        ('{"a": {"b": 1, "b": 1}}', "appears twice"),
        ('"{\\"x\\": NaN}"', "'arguments' is refused"),
        ('"{\\"x\\": 1, \\"x\\": 2}"', "'arguments' is refused"),
    ],
)
def test_what_the_record_could_not_hold_exactly_is_refused(arguments: str, needle: str) -> None:
    action = parse_action(f'{OPEN}{{"name": "calc", "arguments": {arguments}}}{CLOSE}')
    assert action.tool_calls == () and len(action.parse_errors) == 1
    assert needle in action.parse_errors[0], action.parse_errors


def test_a_key_given_twice_at_the_top_is_refused_and_a_name_must_end_where_it_ends() -> None:
    twice = parse_action(f'{OPEN}{{"name": "ls", "name": "rm", "arguments": {{}}}}{CLOSE}')
    assert twice.tool_calls == () and "appears twice" in twice.parse_errors[0]
    for name in ("calc\n", "calc\r", "calc\u2028", " calc", "calc "):
        action = parse_action(f"{OPEN}{json.dumps({'name': name, 'arguments': {}})}{CLOSE}")
        assert action.tool_calls == () and "'name'" in action.parse_errors[0], name
    exact = parse_action(render_call("calc", {"big": 10**30, "small": 1e-300, "text": "naïve ∑ 🙂"}))
    (call,) = exact.tool_calls
    assert call.arguments == {"big": 10**30, "small": 1e-300, "text": "naïve ∑ 🙂"}
    assert json.loads(call.model_dump_json())["arguments"] == call.arguments  # the record is what ran


def test_too_many_calls_are_cut_and_reported() -> None:
    action = parse_action(render_call("ls", {}) * (MAX_CALLS + 3))
    assert len(action.tool_calls) == MAX_CALLS
    assert any("more than" in e for e in action.parse_errors)


def test_ten_thousand_fuzzed_outputs_never_raise_and_are_all_classified() -> None:
    for text in model_outputs(10_000, seed=1234):
        action = parse_action(text)
        # Exactly one of: a final answer, at least one call, or at least one classified error.
        assert action.is_final or action.tool_calls or action.parse_errors


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=500))
def test_any_text_parses_without_raising(text: str) -> None:
    action = parse_action(text)
    assert isinstance(action.parse_errors, tuple)
