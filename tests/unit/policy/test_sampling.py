"""The local sampler: seeds per row, exact reruns, the policy's own logprobs, stops and limits."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from policy_support import chat_ids, reference_logprobs, wrapped_sampler

from reprorl.policy import LoadedModel, tiny_model
from reprorl.policy.draw import filter_logits
from reprorl.policy.sampling import LocalSampler, SampleRequest
from reprorl.types import SamplingParams


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return tiny_model(0)


def _prompt(model: LoadedModel, text: str) -> tuple[int, ...]:
    ids = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return tuple(int(i) for i in ids)


def _requests(model: LoadedModel, seeds: list[int], params: SamplingParams) -> list[SampleRequest]:
    prompts = ["What is 2+2?", "Count the files in /data, then stop.", "Hi"]
    return [
        SampleRequest(f"r{i}", _prompt(model, prompts[i % len(prompts)]), params, seed)
        for i, seed in enumerate(seeds)
    ]


def test_rerun_is_bit_identical_and_members_differ(model: LoadedModel) -> None:
    sampler = LocalSampler.from_loaded(model)
    params = SamplingParams(temperature=1.0, max_tokens=24)
    # The same prompt with distinct seeds: group members must not collapse to one sample.
    requests = [SampleRequest(f"m{i}", _prompt(model, "What is 2+2?"), params, 1000 + i) for i in range(6)]
    first, second = sampler.sample(requests), sampler.sample(requests)
    assert [s.token_ids for s in first] == [s.token_ids for s in second]
    assert [s.logprobs for s in first] == [s.logprobs for s in second]  # to the bit
    assert len({s.token_ids for s in first}) == 6
    assert all(s.batch == tuple(r.key for r in requests) for s in first)
    assert all(s.policy_version == f"base:{model.base_hash}" for s in first)


def test_sampling_leaves_the_global_rng_alone(model: LoadedModel) -> None:
    sampler = LocalSampler.from_loaded(model)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    sampler.sample(_requests(model, [1, 2], SamplingParams(max_tokens=8)))
    assert torch.equal(torch.rand(3), expected)


def test_logprobs_are_the_policys_own(model: LoadedModel) -> None:
    """Each recorded logprob equals a separate full forward's, at the sampling temperature."""
    sampler = LocalSampler.from_loaded(model)
    temperature = 0.7
    sample = sampler.sample(_requests(model, [11], SamplingParams(temperature=temperature, max_tokens=16)))[0]
    prompt = list(_requests(model, [11], SamplingParams())[0].prompt_ids)
    ids = torch.tensor([prompt + list(sample.token_ids)])
    with torch.no_grad():
        logits = model.model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)
    expected = logp.gather(1, torch.tensor(sample.token_ids)[:, None])[:, 0]
    assert len(sample.logprobs) == len(sample.token_ids) == 16
    assert torch.allclose(torch.tensor(sample.logprobs), expected, atol=1e-4)
    assert all(lp <= 0.0 for lp in sample.logprobs)


def test_temperature_zero_and_top_k_one_are_greedy(model: LoadedModel) -> None:
    sampler = LocalSampler.from_loaded(model)
    greedy = sampler.sample(_requests(model, [1], SamplingParams(temperature=0.0, max_tokens=12)))[0]
    top1 = sampler.sample(_requests(model, [99], SamplingParams(temperature=1.3, top_k=1, max_tokens=12)))[0]
    assert greedy.token_ids == top1.token_ids
    prompt = list(_requests(model, [1], SamplingParams())[0].prompt_ids)
    with torch.no_grad():
        logits = model.model(input_ids=torch.tensor([prompt + list(greedy.token_ids)])).logits[0]
    assert logits[len(prompt) - 1 : -1].argmax(-1).tolist() == list(greedy.token_ids)


def test_max_tokens_ends_a_row_with_length(model: LoadedModel) -> None:
    sampler = LocalSampler.from_loaded(model)
    short, long = sampler.sample(
        [
            SampleRequest("a", _prompt(model, "x"), SamplingParams(max_tokens=3), 1),
            SampleRequest("b", _prompt(model, "y"), SamplingParams(max_tokens=9), 2),
        ]
    )
    assert (len(short.token_ids), short.finish_reason) == (3, "length")
    assert (len(long.token_ids), long.finish_reason) == (9, "length")


def test_a_stop_string_ends_the_row_and_is_kept(model: LoadedModel) -> None:
    """Rows stop on their own: one that writes the stop string ends there, the others go on."""
    plain = LocalSampler.from_loaded(model).sample(_requests(model, [7, 8], SamplingParams(max_tokens=40)))
    text = plain[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), "pick a stop string from the row's own text"
    stopping = LocalSampler(
        model.model, model.tokenizer, model_hash=model.base_hash, policy_version="p", stop_strings=(stop,)
    )
    first, second = stopping.sample(_requests(model, [7, 8], SamplingParams(max_tokens=40)))
    assert first.finish_reason == "tool_call"
    assert stop in first.text and len(first.token_ids) < len(plain[0].token_ids)
    assert plain[0].token_ids[: len(first.token_ids)] == first.token_ids
    if stop not in second.text:
        assert second.finish_reason == "length" and len(second.token_ids) == 40


def test_distinct_keys_and_prompts_are_required(model: LoadedModel) -> None:
    sampler = LocalSampler.from_loaded(model)
    request = SampleRequest("same", (1, 2, 3), SamplingParams(max_tokens=2), 0)
    with pytest.raises(ValueError, match="distinct keys"):
        sampler.sample([request, request])
    with pytest.raises(ValueError, match="empty prompt"):
        sampler.sample([SampleRequest("e", (), SamplingParams(), 0)])
    assert sampler.sample([]) == []


def test_bfloat16_sampling_is_reproducible(model: LoadedModel) -> None:
    half = tiny_model(0)
    half.model.to(torch.bfloat16)
    sampler = LocalSampler.from_loaded(half)
    requests = _requests(half, [1, 2, 3], SamplingParams(max_tokens=10))
    a, b = sampler.sample(requests), sampler.sample(requests)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    assert [s.logprobs for s in a] == [s.logprobs for s in b]
    assert sampler.info()["dtype"] == "bfloat16"


def test_filter_logits_by_hand() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top2 = filter_logits(logits, 2, 1.0)
    assert torch.isinf(top2[0, 2:]).all() and torch.isfinite(top2[0, :2]).all()
    # top_p 0.7: 0.5 alone is short of 0.7, 0.5+0.3 reaches it; the rest go.
    nucleus = torch.softmax(filter_logits(logits, 0, 0.7), dim=-1)[0]
    assert nucleus.tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])
    assert torch.equal(filter_logits(logits, 0, 1.0), logits)
    # The most likely token always survives, however small top_p is.
    assert math.isfinite(float(filter_logits(logits, 0, 1e-9)[0, 0]))


def test_a_wrapped_model_takes_the_generic_path_with_the_same_numbers(model: LoadedModel) -> None:
    """A peft-wrapped model (as the training loop samples it) decodes through the model's own
    forward: reproducible, and equal in tokens to the fast path while its adapter is still zero."""
    fast = LocalSampler.from_loaded(model)
    wrapped = wrapped_sampler()
    requests = _requests(model, [4, 5, 6], SamplingParams(temperature=1.0, max_tokens=12))
    a, b = wrapped.sample(requests), wrapped.sample(requests)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    assert [s.logprobs for s in a] == [s.logprobs for s in b]
    reference = fast.sample(requests)
    assert [s.token_ids for s in a] == [s.token_ids for s in reference]
    for x, y in zip(a, reference, strict=True):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
    assert wrapped.info()["version"] == fast.info()["version"]


def _scored_in_float32(model: LoadedModel, request: SampleRequest, tokens: tuple[int, ...]) -> torch.Tensor:
    """Logprobs of `tokens` after the prompt under one float32 forward of the same (bfloat16) weights."""
    full = model.model.float()
    try:
        ids = torch.tensor([request.prompt_ids + tokens])
        with torch.inference_mode():
            logits = full(input_ids=ids).logits[0, len(request.prompt_ids) - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]
    finally:
        full.to(torch.bfloat16)


def test_bfloat16_decode_is_as_close_to_float32_as_the_models_own_forward() -> None:
    """The packed bfloat16 decode and the model's own bfloat16 forward
    (SDPA, through a peft wrapper) against float32 scoring of the same weights and tokens: the
    packed path may not be much further off than the model's own."""
    from reprorl.policy import apply_lora

    half = tiny_model(0)
    half.model.to(torch.bfloat16)
    fast = LocalSampler.from_loaded(half)
    wrapped_model = tiny_model(0)
    wrapped_model.model.to(torch.bfloat16)
    wrapped = LocalSampler(
        apply_lora(wrapped_model.model, rank=4, targets=("q_proj", "v_proj")),
        wrapped_model.tokenizer,
        model_hash=wrapped_model.base_hash,
        policy_version="p",
    )
    requests = _requests(half, [11, 12, 13], SamplingParams(temperature=1.0, max_tokens=24))
    errors: dict[str, list[float]] = {"packed": [], "own": []}
    for name, sampler in (("packed", fast), ("own", wrapped)):
        for request, sample in zip(requests, sampler.sample(requests), strict=True):
            reference = _scored_in_float32(half, request, sample.token_ids)
            errors[name] += (torch.tensor(sample.logprobs) - reference).abs().tolist()
    packed, own = (sum(e) / len(e) for e in (errors["packed"], errors["own"]))
    assert packed < 0.05 and max(errors["packed"]) < 0.5, errors["packed"]
    assert packed < 2 * own + 0.01, (packed, own)


def _system_prompts(model: LoadedModel) -> list[tuple[int, ...]]:
    """Six rows as a training step sends them: one long system prompt, three tasks, two members each."""
    return [
        chat_ids(model, task)
        for task in ["What is 2+2?", "Count the files in /data.", "Hi"]
        for _ in range(2)
    ]


def _forward_shapes(sampler: LocalSampler, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The (rows, positions) of every forward pass the sampler's prefill makes from now on."""
    shapes: list[tuple[int, int]] = []
    forward = sampler._forward

    def spy(ids: torch.Tensor, *args: object) -> torch.Tensor:
        shapes.append((ids.shape[0], ids.shape[1]))
        return forward(ids, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(sampler, "_forward", spy)
    return shapes


def test_a_shared_prefix_and_repeated_prompts_are_computed_once(
    model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prefill runs the common prefix once and each distinct remainder once; every row still
    gets its own policy's tokens and logprobs, and re-running the batch gives the same bits."""
    import reprorl.policy.prefill as sampling

    prompts = _system_prompts(model)
    params = SamplingParams(temperature=1.0, max_tokens=12)
    requests = [SampleRequest(f"r{i}", p, params, 50 + i) for i, p in enumerate(prompts)]
    sampler = LocalSampler.from_loaded(model)
    shapes = _forward_shapes(sampler, monkeypatch)
    shared = sampler.sample(requests)
    prefix = sampling.shared_prefix(prompts)
    assert prefix >= sampling.MIN_SHARED_PREFIX
    assert shapes[0] == (1, prefix)  # the system prompt, once
    assert shapes[1] == (3, max(len(p) for p in prompts) - prefix)  # each task once, not per member
    assert [s.token_ids for s in sampler.sample(requests)] == [s.token_ids for s in shared]
    assert len({s.token_ids for s in shared}) == 6  # members of one prompt still draw their own tokens

    monkeypatch.setattr(sampling, "MIN_SHARED_PREFIX", 1 << 30)
    shapes.clear()
    unshared = sampler.sample(requests)
    assert shapes[0] == (3, max(len(p) for p in prompts))  # the control: no prefix pass
    for a, b, prompt in zip(shared, unshared, prompts, strict=True):
        assert a.token_ids == b.token_ids
        expected = reference_logprobs(model, prompt, a.token_ids)
        torch.testing.assert_close(torch.tensor(a.logprobs), expected, atol=1e-4, rtol=0)


def test_remainders_of_unlike_length_are_prefilled_in_runs(
    model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A multi-turn batch holds a first turn's short remainder beside a later turn's long one: the
    remainders run in passes of like length, each padded only to its own longest, and every row
    still gets its own policy's logprobs, the same bits on a re-run."""
    import reprorl.policy.prefill as prefill

    prompts = [chat_ids(model, "count " * words) for words in (1, 2, 30, 34, 80, 3)]
    prefix = prefill.shared_prefix(prompts)
    tails = [len(p) - prefix for p in prompts]
    runs = prefill.length_runs(tails)
    assert len(runs) >= 3, tails
    params = SamplingParams(temperature=1.0, max_tokens=10)
    requests = [SampleRequest(f"r{i}", p, params, 70 + i) for i, p in enumerate(prompts)]
    sampler = LocalSampler.from_loaded(model)
    shapes = _forward_shapes(sampler, monkeypatch)
    first = sampler.sample(requests)
    passes = shapes[1 : 1 + len(runs)]
    assert shapes[0] == (1, prefix)
    assert passes == [(len(run), max(tails[i] for i in run)) for run in runs]
    assert sum(r * w for r, w in passes) < len(prompts) * max(tails)  # fewer padded positions
    assert [(s.token_ids, s.logprobs) for s in sampler.sample(requests)] == [
        (s.token_ids, s.logprobs) for s in first
    ]
    for sample, prompt in zip(first, prompts, strict=True):
        expected = reference_logprobs(model, prompt, sample.token_ids)
        torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=1e-4, rtol=0)


def test_concurrent_callers_take_turns_and_get_their_serial_bits(
    model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An eval point and a batch sampled ahead share one sampler from two threads: their batches
    decode one at a time, each with the packing made for its own size, so each gets the bits it
    gets alone."""
    import threading
    import time

    import reprorl.policy.sampling as sampling

    params = SamplingParams(temperature=1.0, max_tokens=10)
    small, large = _requests(model, [1, 2], params), _requests(model, [3, 4, 5, 6, 7], params)
    sampler = LocalSampler.from_loaded(model)
    alone = {len(r): sampler.sample(r) for r in (small, large)}
    active, most, used = [0], [0], []
    decode, steps = sampler._decode, sampling.LlamaSteps

    def overlapping(rows: list[object]) -> None:
        active[0] += 1
        most[0] = max(most[0], active[0])
        time.sleep(0.05)  # wide enough for the other thread to come in, were it let in
        try:
            decode(rows)  # type: ignore[arg-type]
        finally:
            active[0] -= 1

    def spy(
        model_: object, packed: sampling.PackedLlama, cache: object, mask: torch.Tensor, w: int
    ) -> object:
        used.append((packed.key[0], mask.shape[0]))
        return steps(model_, packed, cache, mask, w)  # type: ignore[arg-type]

    monkeypatch.setattr(sampler, "_decode", overlapping)
    monkeypatch.setattr(sampling, "LlamaSteps", spy)
    start, results = threading.Barrier(2), {}

    def caller(requests: list[SampleRequest]) -> None:
        start.wait(timeout=10)
        for _ in range(3):
            results.setdefault(len(requests), []).append(sampler.sample(requests))

    threads = [threading.Thread(target=caller, args=(r,)) for r in (small, large)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert most[0] == 1
    assert len(used) == 6 and all(packed == batch for packed, batch in used)
    for size, runs in results.items():
        assert len(runs) == 3
        for run in runs:
            # CPU seconds are the batch's own, measured while it held the sampler.
            assert all(s.cpu_s is not None and s.cpu_s > 0 for s in run)
            assert [(s.token_ids, s.logprobs) for s in run] == [
                (s.token_ids, s.logprobs) for s in alone[size]
            ]


def test_two_samplers_in_one_process_decode_one_batch_at_a_time(
    model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of two policy versions (two samplers) in one rollout worker never decode at once, so
    the worker uses the torch threads it was given, not one set per version."""
    import threading
    import time

    params = SamplingParams(temperature=1.0, max_tokens=4)
    samplers = [LocalSampler.from_loaded(model), LocalSampler.from_loaded(model)]
    active, most = [0], [0]

    def slow(decode: Any) -> Any:
        def overlapping(rows: list[object]) -> None:
            active[0] += 1
            most[0] = max(most[0], active[0])
            time.sleep(0.05)
            try:
                decode(rows)
            finally:
                active[0] -= 1

        return overlapping

    for sampler in samplers:
        monkeypatch.setattr(sampler, "_decode", slow(sampler._decode))
    start = threading.Barrier(2)

    def caller(sampler: LocalSampler, seed: int) -> None:
        start.wait(timeout=10)
        for _ in range(3):
            sampler.sample(_requests(model, [seed], params))

    threads = [threading.Thread(target=caller, args=(s, i)) for i, s in enumerate(samplers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert most[0] == 1


def test_dropping_finished_rows_in_place_gives_the_bits_a_copy_gave(
    model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows that end early are dropped from the decode (several times here: budgets of 2 to 16
    tokens); moving the live slots down in place must leave every row the bits of copying them."""
    from reprorl.policy.fast_llama import LlamaSteps

    requests = [
        SampleRequest(
            f"r{i}", chat_ids(model, "count " * (i + 1)), SamplingParams(max_tokens=2 + 2 * i), 5 + i
        )
        for i in range(8)
    ]
    calls: list[int] = []
    in_place = LlamaSteps.select

    def counted(self: LlamaSteps, keep: torch.Tensor) -> None:
        calls.append(len(keep))
        in_place(self, keep)

    monkeypatch.setattr(LlamaSteps, "select", counted)
    moved = LocalSampler.from_loaded(model).sample(requests)
    assert len(calls) >= 2, calls  # the batch shrank more than once

    def copied(self: LlamaSteps, keep: torch.Tensor) -> None:
        self.keys, self.values = [k[keep] for k in self.keys], [v[keep] for v in self.values]
        self.mask, self.bias, self.positions = self.mask[keep], self.bias[keep], self.positions[keep]

    monkeypatch.setattr(LlamaSteps, "select", copied)
    reference = LocalSampler.from_loaded(model).sample(requests)
    assert [(s.token_ids, s.logprobs) for s in moved] == [(s.token_ids, s.logprobs) for s in reference]
