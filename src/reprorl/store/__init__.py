"""Storage: content-addressed artifacts, the registry of names and runs, and run records."""

from reprorl.store.blobs import ContentStore
from reprorl.store.home import Resolved, Store, default_root
from reprorl.store.registry import ArtifactVersion, Registry, RunEntry
from reprorl.store.runs import RunRecord, find_run, iter_runs, new_run_id, read_log

__all__ = [
    "ArtifactVersion",
    "ContentStore",
    "Registry",
    "Resolved",
    "RunEntry",
    "RunRecord",
    "Store",
    "default_root",
    "find_run",
    "iter_runs",
    "new_run_id",
    "read_log",
]
