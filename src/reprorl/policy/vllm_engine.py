"""vLLM as a training run's rollout engine: its servers, the adapters they hold, requests spread over them.

Each published policy version is a LoRA adapter folder; `publish` loads it into every server under
the version's own name (`adapter:sha256:...`), and `retire` unloads it once nothing will sample from
it again, so a server holds at most the staleness window. A request goes token-in/token-out to the
next live server in turn, naming its adapter; the server's answer must name the same adapter, or it
is refused (`VersionMismatch`, counted). A server that dies is the platform's failure: the request
goes to another server while reprorl starts a replacement (one it owns) with the adapters the dead
one held, and every such incident is an event of the run. vLLM does not report how it batched a
request, so rollouts it samples replay exactly in recorded mode only.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from reprorl.config.engine import VllmEngine
from reprorl.errors import InferenceError
from reprorl.policy.http import HttpSampler
from reprorl.policy.transport import Endpoint, Reply, RetryPolicy
from reprorl.policy.vllm_server import VllmServer, server_args

Event = Callable[..., None]


class VersionMismatch(InferenceError):
    """The server answered from another adapter than the request named."""


class RolloutEngine:
    """The run's vLLM servers and the adapters each holds."""

    def __init__(
        self,
        spec: VllmEngine,
        *,
        model_dir: Path | None,
        dtype: str,
        seed: int,
        lora_rank: int,
        log_dir: Path | None = None,
        on_event: Event | None = None,
    ) -> None:
        self.spec = spec
        self.on_event = on_event or (lambda kind, **fields: None)
        if spec.urls:
            self.servers = [VllmServer(i, url=u) for i, u in enumerate(spec.urls)]
        else:
            if model_dir is None:
                raise ValueError("a vLLM server reprorl starts needs the base model's folder")
            argv, env = server_args(spec, model_dir, dtype=dtype, seed=seed, lora_rank=lora_rank)
            self.servers = [
                VllmServer(i, argv=argv, env=env, startup_timeout_s=spec.startup_timeout_s, log_dir=log_dir)
                for i in range(spec.servers)
            ]
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._replacing: dict[int, threading.Lock] = {s.index: threading.Lock() for s in self.servers}
        self.mismatches = 0
        self.replaced = 0
        self.dropped: set[int] = set()  # attached servers that went down
        self._endpoints: dict[int, tuple[str, Endpoint]] = {}
        self.engine_version = ""

    def start(self) -> None:
        """Start (or check) every server, in parallel: a vLLM start takes a while."""
        with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
            list(pool.map(lambda s: s.start(), self.servers))
        self.engine_version = self.servers[0].version()

    def close(self) -> None:
        for server in self.servers:
            server.kill()
        for _, endpoint in self._endpoints.values():
            endpoint.close()
        self._endpoints.clear()

    def info(self) -> dict[str, Any]:
        """What the record says of the engine (every rollout's sampler carries it)."""
        return {
            "kind": "vllm",
            "engine": "vllm",
            "engine_version": self.engine_version,
            "servers": len(self.servers),
            "attached": list(self.spec.urls),
            "batch_invariant": self.spec.batch_invariant,
            "extra_args": list(self.spec.extra_args),
            "deterministic": self.spec.batch_invariant,
        }

    # -- versions ------------------------------------------------------------------------------

    def publish(self, name: str, folder: Path, policy_version: str) -> EngineSampler:
        """Load the adapter in `folder` as `name` into every server; a sampler that requests it."""
        for server in self.servers:
            self._on_live(server, lambda s: s.load(name, folder))
        self.on_event("engine_loaded", adapter=name, served=self.held())
        return EngineSampler(self, name, policy_version)

    def retire(self, name: str) -> None:
        for server in self.servers:
            if server.healthy():
                server.unload(name)
            else:
                server.loaded.pop(name, None)

    def held(self) -> dict[str, list[str]]:
        """What each server says it serves now (`/v1/models`)."""
        return {str(s.index): s.models() for s in self.servers}

    # -- requests ------------------------------------------------------------------------------

    def post(self, body: dict[str, Any]) -> Reply:
        """Send one completion request to the next server that answers; replace one that died."""
        failures: list[str] = []
        for _ in range(len(self.servers) + 1):
            live = [s for s in self.servers if s.index not in self.dropped]
            if not live:
                break
            server = live[next(self._turn) % len(live)]
            try:
                reply = self._endpoint(server).post("/completions", body)
            except InferenceError as exc:
                if server.healthy():
                    raise  # the server is up and refused the request: not a dead server
                failures.append(f"server {server.index}: {exc}")
                self._replace(server, str(exc))
                continue
            answered = reply.body.get("model")
            if answered != body["model"]:
                with self._lock:
                    self.mismatches += 1
                self.on_event("vllm_version_mismatch", server=server.index, asked=body["model"], got=answered)
                asked = body["model"]
                raise VersionMismatch(f"vLLM server {server.index} answered from {answered!r}, not {asked!r}")
            return reply
        raise InferenceError("no vLLM server could answer: " + "; ".join(failures)[:800])

    def _endpoint(self, server: VllmServer) -> Endpoint:
        url = server.url
        found = self._endpoints.get(server.index)
        if found is None or found[0] != url:
            endpoint = Endpoint(
                url,
                timeout_s=self.spec.timeout_s,
                connect_timeout_s=10.0,
                retry=RetryPolicy(retries=self.spec.retries),
                api_key_env=None,
                max_connections=64,
            )
            found = self._endpoints[server.index] = (url, endpoint)
        return found[1]

    def _on_live(self, server: VllmServer, act: Callable[[VllmServer], None]) -> None:
        if server.index in self.dropped:
            return
        try:
            act(server)
        except InferenceError as exc:
            if server.healthy():
                raise
            self._replace(server, str(exc))
            if server.index not in self.dropped:
                act(server)

    def _replace(self, server: VllmServer, why: str) -> None:
        """Start a dead server again (once, however many requests saw it die)."""
        if not server.owned:  # not reprorl's to restart: the others serve on
            if server.index not in self.dropped:
                self.dropped.add(server.index)
                self.on_event(
                    "vllm_server_dropped", server=server.index, url=server.attached, error=why[:500]
                )
            return
        with self._replacing[server.index]:
            if server.healthy():
                return  # another request replaced it meanwhile
            self.on_event("vllm_server_down", server=server.index, error=why[:500])
            server.kill()
            server.start()
            with self._lock:
                self.replaced += 1
            self.on_event("vllm_server_replaced", server=server.index, adapters=sorted(server.loaded))


class EngineSampler(HttpSampler):
    """An `HttpSampler` of one adapter, its requests sent through the engine's servers."""

    def __init__(self, engine: RolloutEngine, adapter: str, policy_version: str) -> None:
        super().__init__(
            engine.servers[0].url,  # unused: requests go through the engine
            adapter,
            policy_version=policy_version,
            timeout_s=engine.spec.timeout_s,
            max_concurrency=64,
        )
        self.engine = engine

    def info(self) -> dict[str, Any]:
        return {**self.engine.info(), "model": self.model}

    def _post(self, body: dict[str, Any]) -> Reply:
        return self.engine.post(body)
