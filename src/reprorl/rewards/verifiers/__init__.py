"""Outcome verifiers of the built-in env families."""
