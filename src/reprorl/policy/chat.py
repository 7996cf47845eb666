"""The prompt renderer: messages and tools to token ids with the model's own chat template, turn by turn.

Token-in/token-out: a conversation's context is built once and then only appended to. The first
prompt is rendered with the chat template; after each sample, the sampled tokens are kept exactly as
drawn and the tool results are rendered as a delta (the template's text between an assistant turn
and the next generation prompt) and appended. Earlier turns are never rendered again, so the
tokens a trainer scores are the tokens the sampler saw. `rerender_matches` checks the exact-prefix
property: re-rendering the whole conversation with the template gives the same text.

Templates that know no `tools` variable (SmolLM2's) get the tool schemas and the `<tool_call>`
format in the system message; the prompt-template hash covers the template, those instructions
and this renderer's version, so any change to how prompts are made changes the hash.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from reprorl.actions import CLOSE, OPEN
from reprorl.hashing import canonical_json
from reprorl.policy.digest import text_hash
from reprorl.policy.models import chat_template_of
from reprorl.policy.sampling import stop_token_ids
from reprorl.types import Message, Role

RENDERER_VERSION = 1
TOOL_INSTRUCTIONS = (
    "You can call tools. To call one, write a JSON object inside tags, exactly like this:\n"
    + OPEN
    + '{"name": "<tool name>", "arguments": {<arguments as JSON>}}'
    + CLOSE
    + "\nThe result comes back in the next message. When you know the final answer, reply with the "
    "answer only and no tool call.\nTools (JSON schemas):\n"
)
_MARK = "\u2063reprorl-assistant-turn\u2063"


def _as_dict(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role.value, "content": message.content}
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


class ChatRenderer:
    """Renders a conversation for one tokenizer; its `template_hash` names exactly how."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        template = chat_template_of(tokenizer)
        # A template that reads `tools` renders the schemas itself; otherwise reprorl does.
        self.native_tools = "tools" in template
        self.stop_ids = stop_token_ids(tokenizer)
        self.template_hash = text_hash(
            canonical_json(
                {
                    "chat_template": template,
                    "tool_instructions": None if self.native_tools else TOOL_INSTRUCTIONS,
                    "renderer": RENDERER_VERSION,
                }
            )
        )

    def _dicts(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        dicts = [_as_dict(m) for m in messages]
        if tools and not self.native_tools:
            block = TOOL_INSTRUCTIONS + "\n".join(json.dumps(t, sort_keys=True) for t in tools)
            if dicts and dicts[0]["role"] == Role.SYSTEM.value:
                dicts[0] = {**dicts[0], "content": dicts[0]["content"] + "\n\n" + block}
            else:
                dicts.insert(0, {"role": Role.SYSTEM.value, "content": block})
        return dicts

    def render_text(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] = (),
        *,
        generation_prompt: bool = True,
    ) -> str:
        kwargs: dict[str, Any] = {"tools": list(tools)} if tools and self.native_tools else {}
        text = self.tokenizer.apply_chat_template(
            self._dicts(messages, tools), tokenize=False, add_generation_prompt=generation_prompt, **kwargs
        )
        assert isinstance(text, str)
        return text

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(
            self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        )

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = ()) -> list[int]:
        """The first context: the whole conversation so far plus the generation prompt."""
        return self.encode(self.render_text(messages, tools))

    def observation_ids(self, sampled_ids: Sequence[int], observation: Sequence[Message]) -> list[int]:
        """Tokens to append after a sample: close the assistant turn, the tool messages, the next prompt.

        Rendered from a stand-in conversation that ends the same way, so no earlier turn is
        rendered again; a sample that already ended with the turn terminator is not closed twice.
        """
        probe = [
            Message(role=Role.USER, content="u"),
            Message(role=Role.ASSISTANT, content=_MARK),
            *observation,
        ]
        text = self.render_text(probe)
        delta = text[text.index(_MARK) + len(_MARK) :]
        if sampled_ids and sampled_ids[-1] in self.stop_ids:
            ended = self.decode([sampled_ids[-1]])
            delta = delta.removeprefix(ended)
        return self.encode(delta)

    def rerender_matches(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], context_ids: Sequence[int]
    ) -> bool:
        """Whether rendering `messages` afresh gives exactly the text of the appended tokens."""
        return self.render_text(messages, tools) == self.decode(context_ids)
