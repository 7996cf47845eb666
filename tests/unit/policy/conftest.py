"""Fixtures for the policy tests: fresh tiny models, and SmolLM2 loaded once per session."""

from __future__ import annotations

import time

import pytest
from policy_support import FirstLoad, network_attempts

from reprorl.errors import ArtifactNotFoundError
from reprorl.policy import LoadedModel, bundled_gguf, load_base, tiny_model


@pytest.fixture
def tiny() -> LoadedModel:
    """A fresh tiny model (seed 0) per test: LoRA and training modify a model in place."""
    return tiny_model(0)


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> FirstLoad:
    """SmolLM2 converted from its GGUF into a fresh cache, with no network reachable."""
    try:
        bundled_gguf()
    except ArtifactNotFoundError as exc:
        pytest.skip(str(exc))
    cache = tmp_path_factory.mktemp("model-cache")
    with network_attempts() as attempts:
        start = time.perf_counter()
        loaded = load_base(cache_dir=cache)
        seconds = time.perf_counter() - start
    return FirstLoad(loaded, cache, seconds, tuple(attempts))
