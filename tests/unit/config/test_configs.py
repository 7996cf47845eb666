"""The shipped specs: `configs/` validates, the demo spec is the embedded one, every family has one."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from reprorl.config import load_spec

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
FAKE_HASH = "sha256:" + "0" * 64


def _pin(name: str) -> str:
    return f"{name}@{FAKE_HASH}"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_every_config_validates_once_its_names_are_pinned(path: Path) -> None:
    spec = load_spec(path, pin_bare=_pin)
    assert str(spec.model.base).startswith("smollm2-135m-instruct@sha256:")
    assert spec.learning.sft_steps > 0 and spec.evaluation.suites


def test_there_is_a_spec_per_built_in_family_and_the_demo_is_the_embedded_one() -> None:
    assert {p.stem for p in CONFIGS.glob("*.toml")} >= {"demo", "calculator", "sql", "files"}
    embedded = resources.files("reprorl") / "configs" / "demo.toml"
    assert embedded.read_text() == (CONFIGS / "demo.toml").read_text()
    for family, taskset in (("calculator", "calc"), ("sql", "sql"), ("files", "files")):
        spec = load_spec(CONFIGS / f"{family}.toml", pin_bare=_pin)
        assert str(spec.data.train).startswith(f"{taskset}-train@")
        assert str(spec.evaluation.suites[0]).startswith(f"{taskset}-eval@")
        assert (resources.files("reprorl") / "examples" / f"{taskset}-train.jsonl").is_file()
