"""The W&B sink: a run's figures in an offline W&B run under `DIR/wandb/`, never sent anywhere.

W&B keeps one step counter per run, but a record's steps restart per stage (SFT steps, then RL
steps; eval points share the RL steps), so each stage gets its own x-axis: `step` for the main
lines, `<stage>/step` for the others, declared with `define_metric`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reprorl.sinks.base import SinkRun

# W&B's service process reads these when it starts; error reports would go to the network.
FORCED_ENV = {"WANDB_ERROR_REPORTING": "false"}
DEFAULT_ENV = {"WANDB_SILENT": "true"}


def axis_name(stage: str | None) -> str:
    """The W&B x-axis of a stage's lines."""
    return "step" if stage is None else f"{stage}/step"


class WandbSink:
    """An offline W&B run named after the reprorl run, with the spec as its config."""

    def __init__(self, folder: Path, run: SinkRun, *, init_timeout_s: float = 60.0) -> None:
        os.environ.update(FORCED_ENV)
        for key, value in DEFAULT_ENV.items():
            os.environ.setdefault(key, value)
        import wandb

        folder.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(
            mode="offline",
            silent=True,
            console="off",
            # Machine probes and code capture: the run record already holds the environment, and
            # some probes (cloud metadata endpoints) would reach for the network.
            x_disable_stats=True,
            x_disable_meta=True,
            x_disable_machine_info=True,
            x_save_requirements=False,
            disable_git=True,
            save_code=False,
            reinit="create_new",
            init_timeout=init_timeout_s,
        )
        config = {"reprorl": {"run_id": run.run_id, "spec_hash": run.spec_hash}, "spec": run.spec}
        self._run = wandb.init(
            dir=str(folder), project=run.name, name=run.run_id, config=config, settings=settings
        )
        self.path = Path(self._run.dir).parent
        self._axes: set[str] = set()
        self._axis_of: dict[str, str] = {}  # figure → the x-axis it was declared against
        self._status: str | None = None

    def log(self, step: int, stage: str | None, metrics: Mapping[str, float], /, **tags: Any) -> None:
        axis = axis_name(stage)
        if axis not in self._axes:
            self._run.define_metric(axis)
            self._axes.add(axis)
        for key in metrics:
            if self._axis_of.get(key) != axis:
                self._run.define_metric(key, step_metric=axis)
                self._axis_of[key] = axis
        self._run.log({**metrics, axis: step})

    def event(self, name: str, /, **fields: Any) -> None:
        if name == "status":
            self._status = str(fields.get("status"))

    def close(self) -> None:
        self._run.finish(exit_code=1 if self._status == "failed" else 0)
