"""vLLM servers as Ray actors: each runs its server process on the node Ray places it, with its GPUs.

On a cluster the rollout engine's servers are placed like any other part of the run: an actor per
server (`model.vllm.gpus_per_server` GPUs, no CPU slot: the actor only watches its process) starts
vLLM on its node, on the run's base folder in the shared store, and answers with the server's URL.
The engine treats it as a server it owns: a dead one (its node lost, its process killed) is killed
through Ray and started again, wherever Ray places it, with the adapters it held. `model.vllm.host
= "node"` makes a server listen on its node's address, which other nodes need to reach it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Any

from reprorl.config.engine import VllmEngine
from reprorl.errors import InferenceError
from reprorl.local_server import LocalServer
from reprorl.policy.vllm_server import Launch, ServerProcess

# How long a placed server's actor may take to answer a liveness question.
ALIVE_TIMEOUT_S = 10.0


class VllmServerActor:
    """Runs one vLLM server process where Ray placed this actor; it dies with the actor."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        host: str,
        startup_timeout_s: float,
        log_dir: str,
    ) -> None:
        if host == "node":
            import ray

            host = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        self.server = LocalServer(
            name,
            argv,
            env=env,
            startup_timeout_s=startup_timeout_s,
            log_dir=Path(log_dir),
            keep_log=True,
            host=host,
        )

    def start(self) -> dict[str, Any]:
        import ray

        url = self.server.start()
        return {
            "url": url,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "gpus": [str(g) for g in ray.get_gpu_ids()],
        }

    def alive(self) -> bool:
        return self.server.alive

    def stop(self) -> None:
        self.server.kill()


class RayServerProcess:
    """A server process reprorl owns through its Ray actor (`ServerProcess` for the engine)."""

    def __init__(
        self, ray: Any, name: str, argv: list[str], env: dict[str, str], spec: VllmEngine, log_dir: Path
    ) -> None:
        self.ray, self.name, self.argv, self.env, self.spec, self.log_dir = (
            ray,
            name,
            argv,
            env,
            spec,
            log_dir,
        )
        self.actor: Any = None
        self.url: str | None = None
        self.placed: dict[str, Any] = {}

    @property
    def alive(self) -> bool:
        if self.actor is None or self.url is None:
            return False
        try:
            return bool(self.ray.get(self.actor.alive.remote(), timeout=ALIVE_TIMEOUT_S))
        except Exception:  # the actor is gone, or its node: either way the server is
            return False

    def start(self) -> str:
        self.kill()
        actor_class = self.ray.remote(num_cpus=0, num_gpus=self.spec.gpus_per_server, max_restarts=0)(
            VllmServerActor
        )
        self.actor = actor_class.options(name=f"{self.name}-{os.urandom(3).hex()}").remote(
            self.name, self.argv, self.env, self.spec.host, self.spec.startup_timeout_s, str(self.log_dir)
        )
        try:
            self.placed = self.ray.get(self.actor.start.remote(), timeout=self.spec.startup_timeout_s + 60)
        except Exception as exc:
            self.kill()
            raise InferenceError(
                f"{self.name} did not start in its Ray actor: {type(exc).__name__}: {exc}"[:800]
            ) from exc
        self.url = str(self.placed["url"])
        return self.url

    def kill(self) -> None:
        if self.actor is not None:
            with contextlib.suppress(Exception):  # killing the actor kills its server with it
                self.ray.kill(self.actor)
            self.actor = None
        self.url = None


def ray_launch(ray: Any, spec: VllmEngine, run_id: str, log_dir: Path) -> Launch:
    """Servers as Ray actors on the cluster `ray` is connected to."""

    def launch(index: int, argv: list[str], env: dict[str, str]) -> ServerProcess:
        return RayServerProcess(ray, f"vllm-{run_id}-{index}", argv, env, spec, log_dir)

    return launch
