"""The serve layer: a policy exposed over an OpenAI-compatible HTTP API (`reprorl serve policy`)."""

from reprorl.http_server import bind, run_server
from reprorl.serve.batcher import BatchStats, MicroBatcher
from reprorl.serve.launch import ServedPolicy, load_policy, url_of
from reprorl.serve.policy_server import PolicyServer, create_app

__all__ = [
    "BatchStats",
    "MicroBatcher",
    "PolicyServer",
    "ServedPolicy",
    "bind",
    "create_app",
    "load_policy",
    "run_server",
    "url_of",
]
