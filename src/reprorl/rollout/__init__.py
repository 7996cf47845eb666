"""Rollouts: a policy acting in an environment, recorded as a complete trajectory."""

from reprorl.rollout.episode import (
    EpisodeIds,
    EpisodeLimits,
    Policy,
    PolicyOutput,
    ScriptedPolicy,
    run_episode,
)
from reprorl.rollout.families import FAMILIES, Family, get_family
from reprorl.rollout.stats import ToolStats

__all__ = [
    "FAMILIES",
    "EpisodeIds",
    "EpisodeLimits",
    "Family",
    "Policy",
    "PolicyOutput",
    "ScriptedPolicy",
    "ToolStats",
    "get_family",
    "run_episode",
]
