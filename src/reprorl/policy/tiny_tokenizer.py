"""The tiny test model's tokenizer: a byte-level BPE trained in code on a fixed corpus, with ChatML.

It mirrors SmolLM2-135M-Instruct where code depends on it: the same special tokens at the same
ids (`<|endoftext|>` 0, `<|im_start|>` 1, `<|im_end|>` 2 = end of turn and padding), the same
ChatML layout, and no token added in front of plain text. Byte-level BPE encodes any string, so
every text round-trips exactly. The training corpus is fixed, so every build gives the same
tokenizer; the tiny model's seed only changes its weights.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from reprorl.actions import CLOSE, OPEN

END_OF_TEXT, TURN_START, TURN_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (END_OF_TEXT, TURN_START, TURN_END)
TOOL_TAGS = (OPEN, CLOSE)
DEFAULT_VOCAB_SIZE = 1024

# ChatML, as SmolLM2's template renders it, minus the default system prompt it inserts.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_SENTENCES = (
    "You are a helpful assistant. Use the tools when they help, then answer briefly.",
    "What is the result of the expression? Call the calculator tool to compute it.",
    "The answer is the number returned by the tool.",
    "Find the files in the folder and report how many lines each one has.",
    "Which customers placed more than three orders last month?",
    "SELECT name, COUNT(*) FROM orders JOIN customers ON orders.customer_id = customers.id GROUP BY name;",
    "SELECT * FROM users WHERE id = 3 ORDER BY created_at DESC LIMIT 10;",
    "The tool returned an error: the arguments do not match the schema.",
    "I could not parse that tool call. Write JSON with a name and arguments.",
    "Read the file notes/todo.txt and write a summary to notes/summary.txt.",
    "The total is 391, because 17 * 23 = 391 and 391 + 0 = 391.",
    "Thank you! Here is the final answer.",
)
_TOOL_CALLS = (
    '<tool_call>{"name": "calc", "arguments": {"expression": "17 * 23"}}</tool_call>',
    '<tool_call>{"name": "sql", "arguments": {"query": "SELECT COUNT(*) FROM users"}}</tool_call>',
    '<tool_call>{"name": "read_file", "arguments": {"path": "data/report.csv"}}</tool_call>',
    '<tool_call>{"name": "list_files", "arguments": {"path": "."}}</tool_call>',
)


def corpus() -> list[str]:
    """The fixed training text: chat phrases, tool calls, SQL, paths and numbers."""
    lines = [*_SENTENCES, *_TOOL_CALLS]
    # Arithmetic in several spellings, so digits, operators and spaces get merges of their own.
    for a in range(0, 120, 7):
        for b in range(1, 60, 11):
            lines.append(f"{a} + {b} = {a + b}; {a} * {b} = {a * b}; ({a} - {b}) / 2 = {(a - b) / 2}")
    return lines * 3


def build_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Train the BPE and wrap it for transformers; equal arguments give an identical tokenizer."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus(), trainer=trainer)
    # One id per tag makes "stop at the end of a tool call" a single-token check. They are not
    # special: decoding with skip_special_tokens must keep them, or the calls vanish from the text.
    backend.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TOOL_TAGS])
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
        tokenizer_object=backend,
        bos_token=TURN_START,
        eos_token=TURN_END,
        unk_token=END_OF_TEXT,
        pad_token=TURN_END,
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
