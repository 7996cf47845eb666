"""Metric sinks end to end: a tiny run mirrored live (`reprorl run --sink`) and after the fact
(`reprorl runs export-metrics`) into TensorBoard, MLflow and W&B, read back with each tool's own reader.

Each reader must give back exactly the figures of metrics.jsonl, at their steps. The sinks' packages
are optional extras: these tests skip without them, and fail instead under CI
(`REPRORL_REQUIRE_SINKS=1`, set by `.ci/run`, which installs them with `make sinks`).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import struct
import sys
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from cli_support import Cli, tiny_training_store

from reprorl.cli.main import main
from reprorl.config import load_spec, resolve_spec
from reprorl.sinks import split_line
from reprorl.sinks.mlflow_sink import mlflow_key
from reprorl.sinks.wandb_sink import axis_name
from reprorl.store import RunRecord, Store

SPEC = """
name = "tiny-sinks"
seed = 4
[model]
owner = "t@x"
base = "tiny"
adapter = { kind = "lora", rank = 4, alpha = 8.0, targets = ["q_proj", "v_proj"] }
[data]
owner = "t@x"
train = "calc-train"
reward_weights = { outcome = 1.0, valid_calls = 1.0 }
[learning]
owner = "t@x"
steps = 2
sft_steps = 2
lr = 1e-3
group_size = 2
tasks_per_step = 2
max_tokens = 8
max_turns = 2
drop_zero_variance_groups = false
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
"""
KINDS = ("tensorboard", "mlflow", "wandb")
Series = dict[str, list[tuple[int, str]]]  # figure → sorted (step, value as text: NaN compares equal)


def need(*modules: str) -> None:
    """Import the sink's packages (and its reader's), or skip — fail under CI, which installs them."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            message = f"{module} is not installed (make sinks installs the sink extras and readers)"
            if os.environ.get("REPRORL_REQUIRE_SINKS") == "1":
                pytest.fail(message)
            pytest.skip(message)


def text(value: float) -> str:
    return "nan" if math.isnan(value) else repr(value)


def expected(record: RunRecord, *, float32: bool = False) -> Series:
    """Every figure of the run's metric lines, by name, as (step, value) pairs."""
    series: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for line in record.metrics().records:
        step, _, metrics, _ = split_line(line)
        for key, value in metrics.items():
            # TensorBoard keeps scalars as float32.
            kept = struct.unpack("<f", struct.pack("<f", value))[0] if float32 else value
            series[key].append((step, text(kept)))
    return {key: sorted(points) for key, points in series.items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, RunRecord, Path]:
    """One tiny run with all three sinks live, then exported again into fresh folders."""
    need("tensorboardX", "mlflow", "alembic", "wandb")
    tmp = tmp_path_factory.mktemp("sinks")
    store = tiny_training_store(tmp)
    (tmp / "spec.toml").write_text(SPEC)
    home = ["--home", str(tmp / "home")]
    live = [arg for kind in KINDS for arg in ("--sink", f"{kind}:{tmp / 'live' / kind}")]
    assert main([*home, "run", str(tmp / "spec.toml"), *live]) == 0
    (run_id,) = [p.name for p in (tmp / "home" / "runs").iterdir() if not p.name.startswith(".")]
    export = [arg for kind in KINDS for arg in ("--to", f"{kind}:{tmp / 'export' / kind}")]
    assert main([*home, "runs", "export-metrics", run_id[:12], *export]) == 0
    return store, RunRecord(store, run_id), tmp


# -- readers: each tool's own ------------------------------------------------------------------------


def tensorboard_series(folder: Path) -> tuple[Series, list[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})  # 0: keep all
    events.Reload()
    tags = events.Tags()
    series = {tag: sorted((e.step, text(e.value)) for e in events.Scalars(tag)) for tag in tags["scalars"]}
    return series, tags["tensors"]


def mlflow_run(folder: Path, run_id: str) -> tuple[Any, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny-sinks")
    (found,) = client.search_runs([experiment.experiment_id], f"tags.`reprorl.run_id` = '{run_id}'")
    return client, found


def wandb_records(folder: Path) -> list[Any]:
    """The records of the offline run's `.wandb` file, decoded with W&B's own protobuf schema.

    wandb no longer ships a Python reader for its transaction log: the framing (a LevelDB-style log
    of 32 KiB blocks, each record CRC32-checked) is read here, every record with `wandb_internal_pb2`.
    """
    from wandb.proto import wandb_internal_pb2

    (path,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    block, pos, pending, records = 32768, 7, b"", []
    while pos < len(data):
        left = block - pos % block
        if left < 7:  # too little room for a record header: the block is padded
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if (crc, length, kind) == (0, 0, 0):
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc
        pos += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # full / first, then middle / last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_series(records: list[Any], axes: set[str]) -> tuple[Series, dict[str, str]]:
    """Each figure's (x, value) on its declared x-axis, and the axis each figure was declared on."""
    declared = {
        r.metric.name: r.metric.step_metric for r in records if r.WhichOneof("record_type") == "metric"
    }
    series: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for r in records:
        if r.WhichOneof("record_type") != "history":
            continue
        row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
        for key, value in row.items():
            if key.startswith("_") or key in axes:
                continue
            series[key].append((int(row[declared[key]]), text(float(value))))
    return {key: sorted(points) for key, points in series.items()}, declared


# -- the tests ---------------------------------------------------------------------------------------


def test_tensorboard_event_files_hold_the_run_metrics(run: tuple[Store, RunRecord, Path]) -> None:
    need("tensorboard")
    _, record, tmp = run
    want = expected(record, float32=True)
    assert {"sft_loss", "reward_mean", "eval/calc-eval/success"} <= set(want)
    for where in ("live", "export"):
        series, texts = tensorboard_series(tmp / where / "tensorboard" / record.run_id)
        assert series == want, where
        assert {"reprorl/run/text_summary", "events/status/text_summary"} <= set(texts)


def test_mlflow_metric_histories_hold_the_run_metrics(run: tuple[Store, RunRecord, Path]) -> None:
    _, record, tmp = run
    want = expected(record)
    for where in ("live", "export"):
        client, found = mlflow_run(tmp / where / "mlflow", record.run_id)
        got = {
            key: sorted((m.step, text(m.value)) for m in client.get_metric_history(found.info.run_id, key))
            for key in found.data.metrics
        }
        assert got == {mlflow_key(k): v for k, v in want.items()}, where
        assert found.info.status == "FINISHED" and found.info.run_name == record.run_id
        assert found.data.tags["reprorl.spec_hash"] == record.info()["spec_hash"]
        assert found.data.params["learning.sft_steps"] == "2"


def test_wandb_offline_runs_hold_the_run_metrics(run: tuple[Store, RunRecord, Path]) -> None:
    _, record, tmp = run
    want = expected(record)
    lines = record.metrics().records
    stages = {split_line(line)[1] for line in lines}
    axes = {axis_name(stage) for stage in stages}
    for where in ("live", "export"):
        records = wandb_records(tmp / where / "wandb")
        series, declared = wandb_series(records, axes)
        assert series == want, where
        for line in lines:  # each figure is plotted against its own stage's steps
            _, stage, metrics, _ = split_line(line)
            assert all(declared[key] == axis_name(stage) for key in metrics)
        (run_record,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        config = {item.key: json.loads(item.value_json) for item in run_record.config.update}
        assert config["reprorl"] == {"run_id": record.run_id, "spec_hash": record.info()["spec_hash"]}
        assert run_record.display_name == record.run_id
        (exit_record,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
        assert exit_record.exit_code == 0


def test_live_sinks_leave_the_spec_and_its_hash_alone(run: tuple[Store, RunRecord, Path]) -> None:
    store, record, tmp = run
    spec = resolve_spec(load_spec(tmp / "spec.toml", [], pin_bare=store.pin_newest), store.pin)
    assert record.info()["spec_hash"] == spec.spec_hash()
    assert record.spec() == spec.model_dump(mode="json")
    recorded = (record.path / "spec.json").read_text()
    assert str(tmp / "live") not in recorded and not any(kind in recorded for kind in KINDS)
    assert not [e for e in record.events().records if e["event"] in ("sink_disabled", "observer_failed")]


def test_sink_flags_are_checked_before_anything_runs(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "spec.toml").write_text(SPEC)
    spec = str(tmp_path / "spec.toml")
    assert cli.error("run", spec, "--sink", "neptune:x") == (
        "error: --sink: unknown sink 'neptune' (kinds: tensorboard, mlflow, wandb)"
    )
    assert cli.error("runs", "export-metrics", "anyrun") == (
        "error: --to: give at least one KIND:DIR, e.g. --to tensorboard:runs/tb"
    )
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the extra were not installed
    assert cli.error("run", spec, "--sink", f"wandb:{tmp_path / 'wb'}") == (
        "error: sink wandb needs wandb, which is not installed: pip install 'reprorl[wandb]'"
    )
    assert cli.error("runs", "export-metrics", "anyrun", "--to", "wandb:x").endswith(
        "pip install 'reprorl[wandb]'"
    )
    assert not (tmp_path / "home" / "runs").exists() and not (tmp_path / "wb").exists()
