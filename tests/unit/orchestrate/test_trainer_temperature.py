"""A run's trainer computes logprobs at the temperature its rollouts are sampled at."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reprorl.config import RunSpec
from reprorl.orchestrate.run.setup import build_trainer, trained_temperature
from reprorl.policy import tiny_model
from reprorl.policy.sampling import LocalSampler, SampleRequest
from reprorl.store import Store
from reprorl.trainer import Datum
from reprorl.types import SamplingParams

OWNER = "t@example.com"


def _spec(temperature: float) -> RunSpec:
    return RunSpec.model_validate(
        {
            "name": "temp",
            "seed": 0,
            "model": {"owner": OWNER, "base": "m@sha256:" + "0" * 64},
            "data": {"owner": OWNER, "train": "t@sha256:" + "0" * 64},
            "learning": {"owner": OWNER, "temperature": temperature},
            "evaluation": {"owner": OWNER, "suites": ["e@sha256:" + "1" * 64]},
        }
    )


def test_greedy_sampling_is_trained_at_the_unscaled_distribution() -> None:
    assert trained_temperature(0.7) == 0.7 and trained_temperature(0.0) == 1.0


@pytest.mark.parametrize("temperature", [0.5, 1.3])
def test_the_trainers_logprobs_are_the_samplers(tmp_path: Path, temperature: float) -> None:
    """The loss's importance ratios start at 1: the trainer scores each sampled token as the sampler
    drew it. A trainer at another temperature (what a run built before did, at 1.0) does not."""
    loaded = tiny_model(0)
    sampler = LocalSampler(loaded.model, loaded.tokenizer, model_hash=loaded.base_hash, policy_version="v")
    prompt = (5, 6, 7, 8)
    params = SamplingParams(temperature=temperature, max_tokens=12)
    (sample,) = sampler.sample([SampleRequest("r/0", prompt, params, seed=3)])
    trainer = build_trainer(Store(tmp_path / "home"), loaded, _spec(temperature))
    assert trainer.temperature == temperature
    ids = (*prompt, *sample.token_ids)
    datum = Datum(ids, (0,) * len(prompt) + (1,) * len(sample.token_ids), (0.0,) * len(ids))
    (scored,) = trainer.token_logprobs([datum], learned_only=True)
    drawn = torch.tensor(sample.logprobs)
    # The trainer multiplies in bfloat16 (autocast), the sampler here in float32.
    assert float((scored[len(prompt) - 1 :] - drawn).abs().max()) < 2e-2
    trainer.temperature = 1.0
    (unscaled,) = trainer.token_logprobs([datum], learned_only=True)
    assert float((unscaled[len(prompt) - 1 :] - drawn).abs().max()) > 0.1
