"""Where a trainer runs: CUDA when present, unless REPRORL_DEVICE says otherwise; bad values refused."""

from __future__ import annotations

import pytest
import torch

from reprorl.errors import UserInputError
from reprorl.policy import tiny_model
from reprorl.trainer import LocalTrainer
from reprorl.trainer.device import DEVICE_ENV, device_info, make_deterministic, pick_device


def test_the_device_is_cuda_when_present_and_cpu_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    assert pick_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert pick_device().type == "cpu"
    monkeypatch.setenv(DEVICE_ENV, "tpu")
    with pytest.raises(UserInputError, match="REPRORL_DEVICE='tpu': use 'cpu' or 'cuda'"):
        pick_device()
    if not torch.cuda.is_available():
        monkeypatch.setenv(DEVICE_ENV, "cuda")
        with pytest.raises(UserInputError, match="sees no CUDA device"):
            pick_device()


def test_a_cpu_trainer_records_its_threads_and_needs_no_cuda_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    loaded = tiny_model(0)
    trainer = LocalTrainer(loaded.model, loaded.tokenizer, base_hash=loaded.base_hash)
    assert trainer.device.type == "cpu" and next(trainer.model.parameters()).device.type == "cpu"
    info = device_info(trainer.device, autocast_bf16=False)
    rate = info.pop("matmul_flops_per_s")
    assert info == {
        "device": "cpu",
        "master_dtype": "float32",
        "compute_dtype": "float32",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    assert 1e8 < rate < 1e15  # FLOP/s of a float32 GEMM on this CPU: measured, not a placeholder
    settings = make_deterministic(trainer.device)
    assert settings["deterministic"] and "thread count" in settings["why"]
    assert not torch.are_deterministic_algorithms_enabled()  # nothing was switched on the CPU
