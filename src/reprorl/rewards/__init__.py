"""Rewards: outcome verifiers on final states, process rewards on steps, and their composition."""

from reprorl.rewards.base import FinalState, StateAccessError, Verifier, compose
from reprorl.rewards.isolation import ScoreError, VerifierRunner
from reprorl.rewards.process import process_components, step_scores

__all__ = [
    "FinalState",
    "ScoreError",
    "StateAccessError",
    "Verifier",
    "VerifierRunner",
    "compose",
    "process_components",
    "step_scores",
]
