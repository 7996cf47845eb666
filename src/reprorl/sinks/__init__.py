"""Metric sinks: a run's metrics mirrored into TensorBoard, MLflow or W&B, live or after the fact.

Each kind is an optional extra (`pip install 'reprorl[tensorboard]'`, `[mlflow]`, `[wandb]`, or
`[sinks]` for all three); importing this package needs none of them. The run record stays the
source of truth: sinks only receive copies of its lines (docs/sinks.md).
"""

from reprorl.sinks.base import MetricSink, SinkError, SinkFactory, SinkRun, split_line
from reprorl.sinks.export import Export, export_run
from reprorl.sinks.guard import GuardedSink
from reprorl.sinks.observer import DISABLED_EVENT, SinkObserver
from reprorl.sinks.targets import KINDS, SinkKind, SinkTarget, parse_targets

__all__ = [
    "DISABLED_EVENT",
    "KINDS",
    "Export",
    "GuardedSink",
    "MetricSink",
    "SinkError",
    "SinkFactory",
    "SinkKind",
    "SinkObserver",
    "SinkRun",
    "SinkTarget",
    "export_run",
    "parse_targets",
    "split_line",
]
