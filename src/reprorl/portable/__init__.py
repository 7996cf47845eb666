"""Portable runs: one bundle file holding a run's records, inputs and code state, verified on every read."""

from reprorl.portable.export import Exported, export_bundle
from reprorl.portable.importing import Imported, import_bundle
from reprorl.portable.manifest import Manifest, Member, ModelSource
from reprorl.portable.reading import BundleError, Opened, read_bundle

__all__ = [
    "BundleError",
    "Exported",
    "Imported",
    "Manifest",
    "Member",
    "ModelSource",
    "Opened",
    "export_bundle",
    "import_bundle",
    "read_bundle",
]
