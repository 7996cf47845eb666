"""A training run refuses an attached vLLM server whose logprobs are raw (vLLM's default) where the
trainer scores at another temperature, in one line naming the field, before any rollout."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from cli_support import Cli, run_ids, tiny_spec, tiny_training_store
from fastapi import FastAPI

from judge_server import serve
from reprorl.store import find_run

LOGITS = (2.0, 1.0, 0.5, 0.0, -1.0)


def raw_vllm(completions: list[dict[str, Any]]) -> FastAPI:
    """vLLM's answers as a server started without --logprobs-mode would give them."""
    api = FastAPI()
    api.get("/health")(lambda: {})
    api.get("/version")(lambda: {"version": "0.32.0"})
    api.get("/v1/models")(lambda: {"data": [{"id": "base"}]})

    @api.post("/v1/completions")
    def complete(body: dict[str, Any]) -> dict[str, Any]:
        completions.append(body)
        total = math.log(sum(math.exp(z) for z in LOGITS))  # the temperature is not applied
        top = {f"token_id:{i}": z - total for i, z in enumerate(LOGITS)}
        lp = {"tokens": ["token_id:0"], "token_logprobs": [top["token_id:0"]], "top_logprobs": [top]}
        return {"model": body["model"], "choices": [{"text": "a", "logprobs": lp, "finish_reason": "length"}]}

    return api


def test_an_attached_server_with_raw_logprobs_is_refused_before_any_rollout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tiny_training_store(tmp_path)
    completions: list[dict[str, Any]] = []
    with serve(raw_vllm(completions)) as url:
        attached = {"vllm": {"urls": [url], "retries": 0}}
        spec = tiny_spec("raw", model=attached, learning={"temperature": 0.7})
        (tmp_path / "spec.toml").write_text(spec)
        line = Cli(tmp_path / "home", capsys).error("run", str(tmp_path / "spec.toml"))
    assert "model.vllm.urls" in line and "--logprobs-mode processed_logprobs" in line, line
    assert "learning.temperature = 0.7" in line, line
    # Only the probe's two one-token requests reached the server: no rollout was sampled.
    assert [(b["max_tokens"], b["temperature"]) for b in completions] == [(1, 1.0), (1, 0.5)]
    for run_id in run_ids(tmp_path / "home"):
        assert find_run(store, run_id).status()["status"] != "running"
