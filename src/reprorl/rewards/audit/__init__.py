"""Reward audits: exploit probes that a trustworthy verifier gives no reward, and their signatures."""

from reprorl.rewards.audit.probes import PROBES, Probe, probe_named
from reprorl.rewards.audit.signatures import SIGNATURES, signature

__all__ = ["PROBES", "SIGNATURES", "Probe", "probe_named", "signature"]
