"""The installed reprorl's version, as its records and pages print it."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("reprorl")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"
