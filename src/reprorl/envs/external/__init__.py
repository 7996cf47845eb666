"""Environments served by other programs: OpenEnv servers, reached over their own protocol."""

from reprorl.envs.external.openenv_server import ExternalEnvError, OpenEnvServer, OpenEnvServerSpec

__all__ = ["ExternalEnvError", "OpenEnvServer", "OpenEnvServerSpec"]
