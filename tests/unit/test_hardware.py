"""What a precision of "auto" picks: bfloat16 where matmuls run faster in it, float32 elsewhere."""

from __future__ import annotations

import pytest
import torch

from reprorl import hardware
from reprorl.hardware import DEVICE_ENV, auto_dtype, resolve_dtype


def test_auto_on_the_cpu_follows_its_amx_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICE_ENV, "cpu")  # even beside a GPU
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert auto_dtype()[0] == "bfloat16"
    assert resolve_dtype("auto") == "bfloat16"
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    dtype, why = auto_dtype()
    assert dtype == "float32" and "no AMX" in why
    assert resolve_dtype("auto") == "float32"


def test_a_pinned_precision_is_kept_and_anything_else_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "auto_dtype", lambda: ("float32", "test"))
    assert resolve_dtype("bfloat16") == "bfloat16"
    assert resolve_dtype("float32") == "float32"
    with pytest.raises(ValueError, match="'float16': use 'auto', 'float32' or 'bfloat16'"):
        resolve_dtype("float16")
