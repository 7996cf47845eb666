"""Outcome verifiers of the built-in env families, each registered by name (`reprorl.rewards.registered`)."""

from reprorl.rewards.verifiers import expression, files, numeric, reported, sql, verifiers_taskset

__all__ = ["expression", "files", "numeric", "reported", "sql", "verifiers_taskset"]
