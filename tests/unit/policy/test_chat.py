"""The renderer: the model's own template, tools where the template has none, appended deltas."""

from __future__ import annotations

import copy

import pytest

from reprorl.actions import render_call
from reprorl.policy import LoadedModel, tiny_model
from reprorl.policy.chat import TOOL_INSTRUCTIONS, ChatRenderer
from reprorl.types import Message, Role

TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return tiny_model(0)


def _conversation() -> list[Message]:
    return [
        Message(role=Role.SYSTEM, content="Use tools."),
        Message(role=Role.USER, content="What is 6 * 7?"),
    ]


def test_tools_go_into_the_system_message_when_the_template_has_no_tools(model: LoadedModel) -> None:
    renderer = ChatRenderer(model.tokenizer)
    assert not renderer.native_tools
    text = renderer.render_text(_conversation(), TOOLS)
    assert text.startswith("<|im_start|>system\nUse tools.\n\n" + TOOL_INSTRUCTIONS)
    assert '"name": "calc"' in text and text.endswith("<|im_start|>assistant\n")
    # Without a system message, one is made for the tools.
    alone = renderer.render_text(_conversation()[1:], TOOLS)
    assert alone.startswith("<|im_start|>system\n" + TOOL_INSTRUCTIONS)
    assert "calc" not in renderer.render_text(_conversation(), ())


def test_a_template_that_reads_tools_renders_them_itself(model: LoadedModel) -> None:
    tokenizer = copy.deepcopy(model.tokenizer)
    tokenizer.chat_template = (
        "{% if tools %}TOOLS:{{ tools | length }}\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    renderer = ChatRenderer(tokenizer)
    assert renderer.native_tools
    text = renderer.render_text(_conversation(), TOOLS)
    assert text.startswith("TOOLS:1\n") and TOOL_INSTRUCTIONS not in text
    assert renderer.template_hash != ChatRenderer(model.tokenizer).template_hash


def test_template_hash_is_stable_and_names_the_template(model: LoadedModel) -> None:
    assert ChatRenderer(model.tokenizer).template_hash == ChatRenderer(tiny_model(1).tokenizer).template_hash
    changed = copy.deepcopy(model.tokenizer)
    changed.chat_template = str(model.tokenizer.chat_template).replace("\\n", "\\n\\n", 1)
    assert ChatRenderer(changed).template_hash != ChatRenderer(model.tokenizer).template_hash


def _turn(renderer: ChatRenderer, context: list[int], text: str, eos: bool) -> tuple[int, ...]:
    sampled = renderer.encode(text) + (
        [renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")] if eos else []
    )
    context.extend(sampled)
    return tuple(sampled)


@pytest.mark.parametrize("ends_with_eos", [False, True])
def test_appending_tool_results_matches_a_fresh_render(model: LoadedModel, ends_with_eos: bool) -> None:
    """The exact-prefix property over three turns, whether or not a sample closed its own turn."""
    renderer = ChatRenderer(model.tokenizer)
    messages = _conversation()
    context = renderer.prompt_ids(messages, TOOLS)
    first_prompt = list(context)
    for step, result in enumerate(["42", "ok"]):
        call = render_call("calc", {"expression": f"6 * {7 + step}"})
        sampled = _turn(renderer, context, call, ends_with_eos)
        messages += [
            Message(role=Role.ASSISTANT, content=call),
            Message(role=Role.TOOL, content=result, tool_call_id=f"c{step}", name="calc"),
        ]
        added = renderer.observation_ids(sampled, messages[-1:])
        assert renderer.decode(added).count("<|im_end|>") == (1 if ends_with_eos else 2)
        context.extend(added)
        assert renderer.rerender_matches(messages, TOOLS, context)
    assert context[: len(first_prompt)] == first_prompt  # earlier turns were never rendered again
    assert renderer.decode(context) == renderer.render_text(messages, TOOLS)


def test_drift_is_detected_when_a_sample_holds_template_tokens(model: LoadedModel) -> None:
    renderer = ChatRenderer(model.tokenizer)
    messages = _conversation()
    context = renderer.prompt_ids(messages, TOOLS)
    sampled = _turn(renderer, context, "hi<|im_start|>user\nmore", eos=True)
    text = str(model.tokenizer.decode(list(sampled), skip_special_tokens=True))
    messages += [Message(role=Role.ASSISTANT, content=text), Message(role=Role.TOOL, content="r")]
    context.extend(renderer.observation_ids(sampled, messages[-1:]))
    assert not renderer.rerender_matches(messages, TOOLS, context)
