"""Reward audits: exploit probes that a trustworthy verifier gives no reward."""

from reprorl.rewards.audit.probes import PROBES, Probe, probe_named

__all__ = ["PROBES", "Probe", "probe_named"]
