"""The EWMA proximal policy: the average by hand, an exact swap and restore, checkpoints, a real step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reprorl.algos import PPOEWMA, NoCorrection
from reprorl.config.spec import LoraAdapter
from reprorl.policy import tiny_model
from reprorl.trainer import AdamParams, Datum, EWMAWeights, LocalTrainer


def test_the_average_after_two_steps_by_hand() -> None:
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    ewma = EWMAWeights([p], decay=0.75)
    with torch.no_grad():
        p.copy_(torch.tensor([2.0, 0.0]))
    ewma.update()  # 0.75·(1, -2) + 0.25·(2, 0)
    assert ewma.weights[0].tolist() == [1.25, -1.5]
    with torch.no_grad():
        p.copy_(torch.tensor([3.0, 2.0]))
    ewma.update()  # 0.75·(1.25, -1.5) + 0.25·(3, 2)
    assert ewma.weights[0].tolist() == [1.6875, -0.625]
    assert p.tolist() == [3.0, 2.0]  # the live weights are untouched
    with pytest.raises(ValueError, match="decay"):
        EWMAWeights([p], decay=1.0)


def test_swapped_loads_the_average_and_restores_the_originals_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(0)
    params = [
        torch.nn.Parameter(torch.randn(3, 4, generator=gen)),
        torch.nn.Parameter(torch.randn(5, generator=gen).to(torch.bfloat16)),
    ]
    ewma = EWMAWeights(params, decay=0.9)
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=gen).to(p.dtype) / 3)
    ewma.update()
    originals = [p.detach().clone() for p in params]
    with ewma.swapped():
        for p, avg, original in zip(params, ewma.weights, originals, strict=True):
            assert torch.equal(p, avg.to(p.dtype)) and not torch.equal(p, original)
    for p, original in zip(params, originals, strict=True):
        assert torch.equal(p, original) and p.dtype == original.dtype and p.requires_grad
    with pytest.raises(RuntimeError), ewma.swapped():  # an error inside still restores
        raise RuntimeError("boom")
    assert all(torch.equal(p, o) for p, o in zip(params, originals, strict=True))


def test_state_round_trips_exactly(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(1)
    p = torch.nn.Parameter(torch.randn(4, 3, generator=gen))
    ewma = EWMAWeights([p], decay=0.9)
    with torch.no_grad():
        p.mul_(1.7)
    ewma.update()
    torch.save(ewma.state_dict(), tmp_path / "ewma.pt")
    restored = EWMAWeights([torch.nn.Parameter(torch.zeros(4, 3))], decay=0.5)
    restored.load_state_dict(torch.load(tmp_path / "ewma.pt"))
    assert restored.decay == 0.9
    assert torch.equal(restored.weights[0], ewma.weights[0])
    with pytest.raises(ValueError, match="shapes"):
        EWMAWeights([torch.zeros(2)], decay=0.9).load_state_dict(ewma.state_dict())


def test_after_a_step_the_proximal_policy_lies_between_the_old_and_the_new() -> None:
    loaded = tiny_model(0)
    trainer = LocalTrainer.lora(loaded, LoraAdapter(rank=4, targets=("q_proj", "v_proj")), seed=0)
    ewma = EWMAWeights(trainer.params, decay=0.5)
    prompt, good, bad = (5, 6, 7), (20, 21, 22), (30, 31, 32)
    mask = (0, 0, 0, 1, 1, 1)
    data = [Datum(prompt + good, mask, (0.0,) * 6, 1.0), Datum(prompt + bad, mask, (0.0,) * 6, -1.0)]
    old = trainer.token_logprobs(data, learned_only=True)
    # Sampled by the current policy; at the start θ_prox = θ, so π_prox is that policy too.
    start = ewma.proximal_logprobs(trainer, data)
    assert all(torch.equal(a, b) for a, b in zip(old, start, strict=True))
    data = [
        Datum(d.input_ids, d.mask, (0.0, *lp.tolist()), d.advantage, proximal_logprobs=(0.0, *lp.tolist()))
        for d, lp in zip(data, old, strict=True)
    ]
    stats = trainer.forward_backward(data, PPOEWMA(correction=NoCorrection()))
    assert stats["clip_frac_high"] == 0.0
    trainer.optim_step(AdamParams(lr=1e-2))
    ewma.update()
    new = trainer.token_logprobs(data, learned_only=True)
    prox = ewma.proximal_logprobs(trainer, data)
    # The live weights came back: the new policy's logprobs are reproduced exactly.
    assert all(
        torch.equal(a, b) for a, b in zip(new, trainer.token_logprobs(data, learned_only=True), strict=True)
    )
    for o, p, n, sign in zip(old, prox, new, (1.0, -1.0), strict=True):
        o, p, n = o[2:], p[2:], n[2:]  # the learned tokens
        assert not torch.equal(p, o) and not torch.equal(p, n)
        # The rewarded sequence rose and the other fell; θ_prox = (θ_old + θ_new)/2 sits between.
        assert sign * float(o.mean()) < sign * float(p.mean()) < sign * float(n.mean())
    with pytest.raises(ValueError, match="other parameters"):
        EWMAWeights([torch.nn.Parameter(torch.zeros(1))], decay=0.5).proximal_logprobs(trainer, data)
