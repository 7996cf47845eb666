"""Sink targets: `KIND:LOCATION` parsing, the missing-extra error, and how a record line is split."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reprorl.errors import UserInputError
from reprorl.sinks import SinkTarget, parse_targets, split_line


def test_a_target_is_a_kind_and_everything_after_the_first_colon() -> None:
    assert SinkTarget.parse("tensorboard:runs/tb") == SinkTarget(kind="tensorboard", location="runs/tb")
    uri = SinkTarget.parse("mlflow:sqlite:////tmp/x/mlflow.db")
    assert (uri.kind, uri.location, uri.label) == ("mlflow", "sqlite:////tmp/x/mlflow.db", uri.label)
    assert uri.label == "mlflow:sqlite:////tmp/x/mlflow.db"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tensorboard", "--to: give KIND:DIR"),
        ("wandb:  ", "--to: give KIND:DIR"),
        ("neptune:runs", "--to: unknown sink 'neptune' (kinds: tensorboard, mlflow, wandb)"),
    ],
)
def test_a_bad_target_is_one_user_error_naming_the_option(text: str, says: str) -> None:
    with pytest.raises(UserInputError) as error:
        SinkTarget.parse(text, option="--to")
    assert str(error.value).startswith(says)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("kind", "modules", "extra"),
    [
        ("tensorboard", ("tensorboardX",), "tensorboard"),
        ("mlflow", ("mlflow", "alembic"), "mlflow"),
        ("wandb", ("wandb",), "wandb"),
    ],
)
def test_a_sink_whose_package_is_missing_names_the_extra_to_install(
    kind: str, modules: tuple[str, ...], extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in modules:  # each of them missing, whatever this machine has installed
        monkeypatch.setitem(sys.modules, module, None)  # how Python spells "this module cannot be imported"
    with pytest.raises(UserInputError) as error:
        parse_targets([f"{kind}:out"])
    assert str(error.value) == (
        f"sink {kind} needs {', '.join(modules)}, which is not installed: pip install 'reprorl[{extra}]'"
    )


def test_a_metric_line_splits_into_step_stage_figures_and_tags() -> None:
    line = {
        "step": 3,
        "time": "2026-01-01T00:00:00+00:00",
        "stage": "eval",
        "suite": "calc-eval@sha256:ab",
        "eval/calc-eval/success": 0.5,
        "rollouts": 32,
        "ok": True,
        "loss": float("nan"),
    }
    step, stage, metrics, tags = split_line(line)
    assert (step, stage) == (3, "eval")
    assert set(metrics) == {"eval/calc-eval/success", "rollouts", "loss"}
    assert metrics["rollouts"] == 32.0 and isinstance(metrics["rollouts"], float)
    assert tags == {"suite": "calc-eval@sha256:ab", "ok": True, "time": "2026-01-01T00:00:00+00:00"}
    assert split_line({"step": 0, "reward_mean": 1.0})[1] is None  # the main lines have no stage


def test_importing_reprorl_and_its_sinks_loads_no_sink_package() -> None:
    code = (
        "import sys, reprorl, reprorl.sinks, reprorl.cli.main; "
        "print(sorted(m for m in ('tensorboardX', 'mlflow', 'wandb') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"
