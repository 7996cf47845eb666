"""The per-episode sandbox: a private directory and a confined, network-less process running tool code.

See `pool.py` for how sandboxes are made and `docs/architecture.md` for the isolation they give.
"""

from reprorl.envs.sandbox.context import ToolContext
from reprorl.envs.sandbox.errors import SandboxError, UnknownToolError
from reprorl.envs.sandbox.layout import reap_sandboxes
from reprorl.envs.sandbox.limits import SandboxLimits
from reprorl.envs.sandbox.pool import OpeningSandbox, SandboxPool
from reprorl.envs.sandbox.result import CallResult
from reprorl.envs.sandbox.sandbox import Sandbox

__all__ = [
    "CallResult",
    "OpeningSandbox",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxPool",
    "ToolContext",
    "UnknownToolError",
    "reap_sandboxes",
]
