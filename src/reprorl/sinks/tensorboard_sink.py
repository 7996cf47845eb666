"""The TensorBoard sink: a run's figures as scalar series in event files under `DIR/<run_id>/`."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reprorl.sinks.base import SinkRun, wall_time


class TensorBoardSink:
    """Writes with tensorboardX: real event files at a fraction of what `tensorboard` itself installs."""

    def __init__(self, folder: Path, run: SinkRun) -> None:
        from tensorboardX import SummaryWriter

        # A NaN figure is a recorded value here, not a mistake worth a warning on every line.
        logging.getLogger("tensorboardX.x2num").setLevel(logging.ERROR)
        self.path = folder / run.run_id
        self._writer = SummaryWriter(logdir=str(self.path), flush_secs=5)
        about = {"run_id": run.run_id, "name": run.name, "spec_hash": run.spec_hash}
        self._writer.add_text("reprorl/run", json.dumps(about, sort_keys=True), 0)

    def log(self, step: int, stage: str | None, metrics: Mapping[str, float], /, **tags: Any) -> None:
        walltime = wall_time(tags)
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step, walltime=walltime)

    def event(self, name: str, /, **fields: Any) -> None:
        step = fields.get("step")
        self._writer.add_text(
            f"events/{name}",
            json.dumps(fields, sort_keys=True, default=str),
            global_step=step if isinstance(step, int) and not isinstance(step, bool) else None,
            walltime=wall_time(fields),
        )

    def close(self) -> None:
        self._writer.close()
