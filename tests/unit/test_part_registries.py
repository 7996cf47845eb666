"""Registries of named parts: decorators register where a part is defined, entry points load lazily
by name, a broken or misnamed plug-in is one line, and a verifier's arguments are part of its version."""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from reprorl.errors import UserInputError
from reprorl.registry import Registry
from reprorl.rewards import FinalState, Verifier
from reprorl.rewards.registered import VERIFIERS, register_verifier, registry_args
from reprorl.rewards.verifiers.numeric import NumericAnswer
from reprorl.types import Task


def _plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    (tmp_path / "plugin_parts.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "plugin_parts", raising=False)


def _registry(points: list[EntryPoint]) -> Registry[Any]:
    registry: Registry[Any] = Registry("part", "test.parts", accept=lambda name, loaded: loaded)
    registry._points = lambda: points  # type: ignore[method-assign]  # what `entry_points` would list
    return registry


def test_an_entry_point_loads_only_when_its_name_is_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _plugin(tmp_path, monkeypatch, "PART = object()\n")
    registry = _registry([EntryPoint("mine", "plugin_parts:PART", "test.parts")])
    registry.add("own", "registered here")
    assert registry["own"] == "registered here" and "plugin_parts" not in sys.modules
    assert registry.names() == ["mine", "own"] and "plugin_parts" not in sys.modules
    part = registry["mine"]
    assert part is sys.modules["plugin_parts"].PART
    assert registry.origin("mine").entry_point == "test.parts:mine"
    with pytest.raises(KeyError, match="no part 'other'; parts: mine, own"):
        registry["other"]
    with pytest.raises(ValueError, match="already registered"):
        registry.add("own", "another part")


def test_a_broken_plugin_is_named_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _plugin(tmp_path, monkeypatch, "raise RuntimeError('half-installed')\n")
    registry = _registry([EntryPoint("broken", "plugin_parts:PART", "test.parts")])
    with pytest.raises(UserInputError, match=r"entry point 'broken' .* failed to load .*half-installed"):
        registry["broken"]
    misnamed = Registry[Any]("part", "test.parts", accept=lambda name, loaded: None)
    misnamed._points = lambda: [EntryPoint("x", "json:dumps", "test.parts")]  # type: ignore[method-assign]
    with pytest.raises(UserInputError, match="registers no part named 'x'"):
        misnamed["x"]


def test_an_override_holds_inside_its_block_only() -> None:
    registry: Registry[str] = Registry("part", "test.parts")
    registry.add("a", "built in")
    with registry.override("a", "planted"):
        assert registry["a"] == "planted"
    assert registry["a"] == "built in"
    with registry.override("new", "planted"):
        assert "new" in registry
    assert "new" not in registry


def test_a_registered_verifier_records_its_arguments_in_its_version() -> None:
    class Threshold(Verifier):
        """A verifier that is no dataclass: its arguments are captured by the decorator."""

        def __init__(self, cutoff: float, *, strict: bool = False) -> None:
            self.cutoff, self.strict = cutoff, strict

        def score(self, task: Task, state: FinalState) -> dict[str, float]:
            return {self.name: 1.0}

    register_verifier("test-threshold")(Threshold)
    try:
        assert VERIFIERS["numeric"] is NumericAnswer and NumericAnswer.registry_name == "numeric"
        assert registry_args(NumericAnswer(abs_tol=0.5)) == {"abs_tol": 0.5}
        assert registry_args(Threshold(0.3)) == {"cutoff": 0.3, "strict": False}
        assert Threshold(0.3).version == Threshold(0.3).version != Threshold(0.4).version
        assert Threshold(0.3).version != Threshold(0.3, strict=True).version
        assert VERIFIERS["test-threshold"] is Threshold
    finally:
        VERIFIERS.remove("test-threshold")  # the registry is the process's: leave it as found
