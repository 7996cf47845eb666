"""Agent programs as policies: the proxy they call, each rollout's exchange, their launch in the sandbox."""

from reprorl.rollout.agents.driver import AgentDriver, agent_limits
from reprorl.rollout.agents.exchange import Exchange, ExchangeLimits
from reprorl.rollout.agents.program import AgentProgram, resolve_program
from reprorl.rollout.agents.proxy import AgentProxy

__all__ = [
    "AgentDriver",
    "AgentProgram",
    "AgentProxy",
    "Exchange",
    "ExchangeLimits",
    "agent_limits",
    "resolve_program",
]
