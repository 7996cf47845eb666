"""Sink targets: `KIND:LOCATION` as given to `--sink` / `--to`, checked before anything runs.

Each kind is an optional extra of reprorl; a target whose package is missing is refused with the
one command that installs it, before a run starts rather than halfway through one.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from reprorl.errors import UserInputError
from reprorl.sinks.base import MetricSink, SinkRun

SinkKind = Literal["tensorboard", "mlflow", "wandb"]


@dataclass(frozen=True)
class KindInfo:
    modules: tuple[str, ...]  # what must import for this kind to work
    extra: str  # the reprorl extra that installs them
    where: str  # what LOCATION is, for help and errors


KINDS: dict[str, KindInfo] = {
    "tensorboard": KindInfo(("tensorboardX",), "tensorboard", "a folder; event files go to DIR/<run id>/"),
    "mlflow": KindInfo(
        ("mlflow", "alembic"), "mlflow", "a folder (SQLite store DIR/mlflow.db) or a tracking URI"
    ),
    "wandb": KindInfo(("wandb",), "wandb", "a folder; an offline run goes to DIR/wandb/"),
}


def _importable(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


class SinkTarget(BaseModel):
    """One sink to open: its kind and where it writes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: SinkKind = Field(description="tensorboard, mlflow or wandb.")
    location: str = Field(min_length=1, description="Folder (or, for mlflow, tracking URI) to write to.")

    @classmethod
    def parse(cls, text: str, *, option: str = "--sink") -> SinkTarget:
        """`KIND:LOCATION`; a bad one is a `UserInputError` naming the option and the kinds."""
        kind, sep, location = text.partition(":")
        kinds = ", ".join(KINDS)
        if not sep or not location.strip():
            raise UserInputError(f"give KIND:DIR, e.g. tensorboard:runs/tb (kinds: {kinds})", field=option)
        if kind not in KINDS:
            raise UserInputError(f"unknown sink {kind!r} (kinds: {kinds})", field=option)
        return cls.model_validate({"kind": kind, "location": location})

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.location}"

    def require(self) -> None:
        """Raise a `UserInputError` naming the extra to install when this kind's package is missing."""
        info = KINDS[self.kind]
        missing = [m for m in info.modules if not _importable(m)]
        if missing:
            raise UserInputError(
                f"sink {self.kind} needs {', '.join(missing)}, which is not installed: "
                f"pip install 'reprorl[{info.extra}]'"
            )

    def open(self, run: SinkRun) -> MetricSink:
        """Start this sink's own run for `run` (imports the sink's package)."""
        if self.kind == "tensorboard":
            from reprorl.sinks.tensorboard_sink import TensorBoardSink

            return TensorBoardSink(Path(self.location).expanduser(), run)
        if self.kind == "mlflow":
            from reprorl.sinks.mlflow_sink import MlflowSink

            return MlflowSink(self.location, run)
        from reprorl.sinks.wandb_sink import WandbSink

        return WandbSink(Path(self.location).expanduser(), run)


def parse_targets(texts: list[str] | None, *, option: str = "--sink") -> list[SinkTarget]:
    """Every `KIND:LOCATION` of a repeated option, each checked to be installed."""
    targets = [SinkTarget.parse(text, option=option) for text in texts or []]
    for target in targets:
        target.require()
    return targets
