"""Kept caches: an episode's next turn takes its previous turn's keys and values and computes only what
it adds, with its policy's own logprobs and the same bits on a re-run of the same batches."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from policy_support import chat_ids, reference_logprobs, wrapped_sampler

from reprorl.policy import LoadedModel, tiny_model
from reprorl.policy.kept import KeptCaches
from reprorl.policy.sampling import LocalSampler, Sample, SampleRequest
from reprorl.types import SamplingParams

PARAMS = SamplingParams(temperature=1.0, max_tokens=9)


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return tiny_model(0)


def _delta(model: LoadedModel, text: str) -> tuple[int, ...]:
    return tuple(int(i) for i in model.tokenizer.encode(text, add_special_tokens=False))


def _first(model: LoadedModel, sampler: LocalSampler) -> tuple[list[SampleRequest], list[Sample]]:
    """Four episodes' first turns, kept."""
    first = [
        SampleRequest(f"e{i}/0", chat_ids(model, "count " * words), PARAMS, 10 + i, keep=True)
        for i, words in enumerate((10, 30, 60, 90))
    ]
    return first, sampler.sample(first)


def _second(model: LoadedModel, first: list[SampleRequest], one: list[Sample]) -> list[SampleRequest]:
    """Their second turns (tool results of unlike lengths), with two first turns of new episodes."""
    second = [
        SampleRequest(
            f"e{i}/1",
            (*r.prompt_ids, *s.token_ids, *_delta(model, "result: " + "7 " * (1 + 4 * i))),
            PARAMS,
            20 + i,
            continues=r.key,
            keep=True,
        )
        for i, (r, s) in enumerate(zip(first, one, strict=True))
    ]
    fresh = [
        SampleRequest(f"n{i}/0", chat_ids(model, "new " * (i + 2)), PARAMS, 30 + i, keep=True)
        for i in range(2)
    ]
    return second + fresh


def _positions(sampler: LocalSampler, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The positions (rows x width) of every forward pass the sampler's prefill makes from now on."""
    seen: list[int] = []
    forward = sampler._forward

    def spy(ids: torch.Tensor, *args: object) -> torch.Tensor:
        seen.append(ids.shape[0] * ids.shape[1])
        return forward(ids, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(sampler, "_forward", spy)
    return seen


def _bits(samples: list[Sample]) -> list[tuple[tuple[int, ...], tuple[float, ...], int]]:
    return [(s.token_ids, s.logprobs, s.reused) for s in samples]


def test_a_next_turn_computes_only_what_it_adds_with_its_policys_logprobs(
    model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    sampler = LocalSampler.from_loaded(model)
    first, one = _first(model, sampler)
    assert all(s.finish_reason == "length" for s in one)  # a reply that may go on is kept
    second = _second(model, first, one)
    kept_positions = _positions(sampler, monkeypatch)
    two = sampler.sample(second)

    for sample, before, prior in zip(two, first, one, strict=False):
        assert sample.reused == len(before.prompt_ids) + len(prior.token_ids) - 1
    assert [s.reused for s in two[4:]] == [0, 0]
    for request, sample in zip(second, two, strict=True):
        reference = reference_logprobs(model, request.prompt_ids, sample.token_ids)
        assert torch.allclose(torch.tensor(sample.logprobs), reference, atol=1e-4), request.key
    # Taken once: the first turns are gone, the second turns (which may go on) are kept.
    assert not any(r.key in sampler.kept for r in first)
    assert all(r.key in sampler.kept for r in second)

    # Without kept caches the same second turns recompute their whole contexts.
    plain = LocalSampler.from_loaded(model, keep_bytes=0)
    assert _bits(_first(model, plain)[1]) == _bits(one)
    recomputed = _positions(plain, monkeypatch)
    alone = plain.sample(second)
    assert [s.reused for s in alone] == [0] * len(second)
    assert 3 * sum(kept_positions) < sum(recomputed), (kept_positions, recomputed)

    # The same batches in the same order give the same bits.
    again = LocalSampler.from_loaded(model)
    _first(model, again)
    assert _bits(again.sample(second)) == _bits(two)


def test_new_weights_and_a_changed_context_take_only_what_still_holds(model: LoadedModel) -> None:
    sampler = LocalSampler.from_loaded(model)
    first, one = _first(model, sampler)
    second = _second(model, first, one)
    sampler.policy_version = "adapter:sha256:other"  # the weights changed between the turns
    assert [s.reused for s in sampler.sample(second[:2])] == [0, 0]

    sampler = LocalSampler.from_loaded(model)
    first, one = _first(model, sampler)
    request = second[3]
    cut = len(first[3].prompt_ids) + 2  # the agent kept 2 of the sampled tokens, then its own text
    edited = replace(request, prompt_ids=(*request.prompt_ids[:cut], *_delta(model, "edited")))
    (sample,) = sampler.sample([edited])
    assert sample.reused == cut
    reference = reference_logprobs(model, edited.prompt_ids, sample.token_ids)
    assert torch.allclose(torch.tensor(sample.logprobs), reference, atol=1e-4)


def test_kept_caches_drop_the_oldest_past_their_budget() -> None:
    def tensors(n: int) -> list[torch.Tensor]:
        return [torch.zeros(2, n, 4)]  # 8 floats per position: 32 bytes, x2 for keys and values

    kept = KeptCaches(max_bytes=64 * 10)
    kept.put("a", range(4), tensors(4), tensors(4), "v")
    kept.put("b", range(4), tensors(4), tensors(4), "v")
    assert kept.nbytes == 2 * 256 and len(kept) == 2
    kept.put("c", range(3), tensors(3), tensors(3), "v")  # 704 bytes in all: "a" goes
    assert "a" not in kept and "b" in kept and "c" in kept
    kept.put("huge", range(11), tensors(11), tensors(11), "v")  # beyond the whole budget: not kept
    assert "huge" not in kept and len(kept) == 2
    base = kept.take("b", (0, 1, 9, 9, 9), "v")
    assert base is not None and base.length == 2  # the positions the contexts share
    assert kept.take("b", (0, 1, 9), "v") is None  # taken once
    assert kept.take("c", (0, 1, 2), "w") is None and "c" not in kept  # other weights: dropped


def test_the_generic_path_continues_a_kept_cache_with_its_policys_logprobs(model: LoadedModel) -> None:
    """A peft-wrapped model decodes through its own forward and a growing cache: its kept caches
    (taken from that cache) give a next turn the same logprobs as a fresh forward."""
    sampler = wrapped_sampler()
    first, one = _first(model, sampler)
    second = _second(model, first, one)
    two = sampler.sample(second)
    assert [s.reused > 0 for s in two] == [True] * 4 + [False] * 2
    for request, sample in zip(second, two, strict=True):
        reference = reference_logprobs(model, request.prompt_ids, sample.token_ids)
        assert torch.allclose(torch.tensor(sample.logprobs), reference, atol=1e-4), request.key
