"""`reprorl runs export-adapter`: a run's adapter as a plain peft folder that peft loads by itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_support import Cli, run_ids, tiny_spec, tiny_training_store
from peft import AutoPeftModelForCausalLM

from reprorl.cli.main import main
from reprorl.policy import load_adapter, load_base
from reprorl.store import Store, find_run


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("export")
    tiny_training_store(tmp)
    (tmp / "spec.toml").write_text(tiny_spec("export", learning={"steps": 1}, evaluation={"every_steps": 50}))
    assert main(["--home", str(tmp / "home"), "run", str(tmp / "spec.toml")]) == 0
    (run_id,) = run_ids(tmp / "home")
    return tmp, run_id


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([[1, 5, 9, 42, 7]])).logits  # type: ignore[no-any-return]


@pytest.mark.parametrize("copy_base", [False, True])
def test_peft_loads_the_export_alone_and_computes_what_reprorl_computes(
    trained: tuple[Path, str], capsys: pytest.CaptureFixture[str], copy_base: bool
) -> None:
    tmp, run_id = trained
    cli = Cli(tmp / "home", capsys)
    out = tmp / f"exported-{copy_base}"
    info = cli.ok_json(
        "runs", "export-adapter", run_id, "-o", str(out), *(["--copy-base"] if copy_base else [])
    )
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == info["base_model_path"]
    assert Path(info["base_model_path"]).is_dir() and not info["base_model_path"].startswith("sha256:")
    if copy_base:
        assert info["base_model_path"] == str(out / "base")
    # reprorl's own identity of both stays beside the weights.
    kept = json.loads((out / "reprorl.json").read_text())
    assert kept["base_model_hash"].startswith("sha256:") and kept["run_id"] == run_id
    record = find_run(Store(tmp / "home"), run_id)
    assert kept["adapter_hash"] in {e.get("adapter") for e in record.events().records}

    exported = AutoPeftModelForCausalLM.from_pretrained(str(out)).eval()
    base = load_base(info["base_model_path"])
    ours = load_adapter(base.model, record.path / "adapter").eval()
    assert torch.equal(_logits(exported), _logits(ours))
    # The adapter is not a no-op: without it the logits differ.
    with ours.disable_adapter():
        assert not torch.equal(_logits(ours), _logits(exported))


def test_an_export_into_a_folder_in_use_is_refused_and_writes_nothing(
    trained: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    tmp, run_id = trained
    taken = tmp / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep")
    line = Cli(tmp / "home", capsys).error("runs", "export-adapter", run_id, "-o", str(taken))
    assert "--out" in line and "not an empty folder" in line
    assert [p.name for p in taken.iterdir()] == ["mine.txt"]
    assert not list(tmp.glob(".tmp-taken-*"))
