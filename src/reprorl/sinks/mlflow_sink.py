"""The MLflow sink: a run's figures as MLflow metric histories, its spec as parameters.

A folder becomes MLflow's SQLite tracking store `DIR/mlflow.db` (MLflow 3 keeps its plain-file
store in maintenance mode and refuses it by default); a tracking URI is used as given.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from reprorl.sinks.base import SinkRun, wall_time

T = TypeVar("T")

URI_PREFIXES = ("sqlite:", "file:", "http:", "https:", "postgresql", "mysql", "databricks")
# MLflow's own limits (mlflow.utils.validation).
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_LENGTH = 6000
MAX_KEY_LENGTH = 250
BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")
TERMINAL = {"succeeded": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}
# MLflow's usage telemetry fetches its settings from the network as soon as a client starts.
QUIET_ENV = {"MLFLOW_DISABLE_TELEMETRY": "true"}


def tracking_uri(location: str) -> tuple[str, str | None]:
    """The tracking URI for a `--sink mlflow:` location, and where artifacts go (None: MLflow's default)."""
    if location.startswith(URI_PREFIXES):
        return location, None
    folder = Path(location).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}", (folder / "artifacts").as_uri()


def mlflow_key(name: str) -> str:
    """A record name as MLflow accepts it: other characters become `_`."""
    return BAD_KEY_CHARS.sub("_", name)[:MAX_KEY_LENGTH]


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from flatten(item, f"{prefix}.{key}" if prefix else str(key))
    else:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        yield prefix, text[:MAX_PARAM_LENGTH]


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class MlflowSink:
    """One MLflow run per reprorl run, in the experiment named after the run's spec name."""

    def __init__(self, location: str, run: SinkRun) -> None:
        import logging

        for key, value in QUIET_ENV.items():
            os.environ.setdefault(key, value)
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        # Creating the store's tables logs at INFO on every new folder; the CLI stays quiet.
        for name in ("mlflow.store.db.utils", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)
        uri, artifacts = tracking_uri(location)
        self.tracking_uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(run.name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            try:
                experiment_id = self._client.create_experiment(run.name, artifact_location=artifacts)
            except MlflowException:  # another process created it first
                experiment_id = self._client.get_experiment_by_name(run.name).experiment_id
        tags = {"reprorl.run_id": run.run_id, "reprorl.spec_hash": run.spec_hash}
        created = self._client.create_run(experiment_id, run_name=run.run_id, tags=tags)
        self.run_id: str = created.info.run_id
        params = [Param(mlflow_key(k), v) for k, v in flatten(run.spec)]
        for batch in chunks(params, MAX_PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=list(batch))
        self._status: str | None = None

    def log(self, step: int, stage: str | None, metrics: Mapping[str, float], /, **tags: Any) -> None:
        from mlflow.entities import Metric

        stamp = int((wall_time(tags) or time.time()) * 1000)
        batch = [Metric(mlflow_key(k), v, stamp, step) for k, v in metrics.items()]
        for part in chunks(batch, MAX_METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=list(part))

    def event(self, name: str, /, **fields: Any) -> None:
        if name == "status":
            self._status = str(fields.get("status"))

    def close(self) -> None:
        # A run that has not ended (its record still says running) stays RUNNING: that is the truth.
        terminal = TERMINAL.get(self._status or "")
        if terminal is not None:
            self._client.set_terminated(self.run_id, terminal)
