"""`reprorl spec validate` reads a spec as `reprorl run` does: every shipped spec passes, bare names
are listed with what they would pin to, and nothing is written."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
from cli_support import Cli

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_spec_validates_and_names_its_unpinned_names(cli: Cli, config: Path) -> None:
    code, out, err = cli("spec", "validate", str(config))
    assert code == 0, err
    assert "is not registered in this store" in out
    assert not cli.home.exists()  # validating wrote nothing, not even an empty home


def test_a_bare_name_is_shown_with_the_hash_run_would_pin(cli: Cli, tmp_path: Path) -> None:
    from reprorl.store import Store

    store = Store(cli.home)
    with resources.as_file(resources.files("reprorl") / "examples" / "calc-train.jsonl") as path:
        version = store.add("calc-train", path, kind="taskset")
    config = next(c for c in CONFIGS if c.name == "calculator.toml")
    summary = cli.ok_json("spec", "validate", str(config))
    assert summary["bare_names"]["calc-train"] == version.ref
    assert summary["bare_names"]["calc-eval"] is None and summary["resolved"] is False
    assert summary["references"]["data.train"] == version.ref


def test_a_real_error_is_still_one_line_naming_the_field(cli: Cli) -> None:
    config = next(c for c in CONFIGS if c.name == "calculator.toml")
    assert "budget.max_usd" in cli.error("spec", "validate", str(config), "budget.max_usd=-1")
