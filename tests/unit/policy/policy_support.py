"""Helpers for the policy tests: a network guard, the record of SmolLM2's first load, chat prompts
under a long shared system prompt, and a row's logprobs from one unpadded forward."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from reprorl.policy import LoadedModel
from reprorl.policy.sampling import LocalSampler


@contextlib.contextmanager
def network_attempts() -> Iterator[list[str]]:
    """Refuse and record every attempt to open a connection or resolve a name."""
    attempts: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(repr(args[:2]))
        raise OSError("network access attempted during a policy test")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", refuse)
        patch.setattr(socket.socket, "connect_ex", refuse)
        patch.setattr(socket, "getaddrinfo", refuse)
        patch.setattr(socket, "create_connection", refuse)
        yield attempts


@dataclass(frozen=True)
class FirstLoad:
    """SmolLM2 as loaded from its GGUF into an empty cache, and what that took."""

    loaded: LoadedModel
    cache: Path
    seconds: float
    network_attempts: tuple[str, ...]


SYSTEM = "You are a careful assistant. Use the tools. " * 6


def chat_ids(model: LoadedModel, task: str, system: str = SYSTEM) -> tuple[int, ...]:
    """The first prompt of a task under the long system prompt every row shares."""
    ids = model.tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": task}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    return tuple(int(i) for i in ids)


def reference_logprobs(model: LoadedModel, prompt: tuple[int, ...], tokens: tuple[int, ...]) -> torch.Tensor:
    """The sampled tokens' logprobs from one unpadded forward pass over the row alone."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logits = model.model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return logp.gather(1, torch.tensor(tokens)[:, None])[:, 0]


def wrapped_sampler() -> LocalSampler:
    """A sampler of a fresh tiny model (seed 0) wrapped by peft with a zero LoRA adapter: it decodes
    through the model's own forward (the generic path), with the fast path's numbers."""
    from reprorl.policy import apply_lora, tiny_model

    wrapped = tiny_model(0)
    return LocalSampler(
        apply_lora(wrapped.model, rank=4, targets=("q_proj", "v_proj")),
        wrapped.tokenizer,
        model_hash=wrapped.base_hash,
        policy_version="p",
    )
