"""vLLM as a training run's rollout engine: its servers, the adapters they hold, requests spread over them.

Each published policy version is a LoRA adapter folder; `publish` loads it into every server under
the version's own name (`adapter:sha256:...`), and `retire` unloads it once nothing will sample from
it again, so a server holds at most the staleness window. A request goes token-in/token-out to the
next live server in turn, naming its adapter; the server's answer must name the same adapter, or it
is refused (`VersionMismatch`, counted). A server that dies is the platform's failure: the request
goes to another server while reprorl starts a replacement (one it owns) with the adapters the dead
one held, and every such incident is an event of the run. Fully fine-tuned versions are reloaded
into the servers in place instead (`publish_weights`), and a request goes only to a server holding
the weights it names. Another process (a Ray rollout worker) asks the servers through a view of
them built from a `ServedVersion`. vLLM does not report how it batched a request, so rollouts it
samples replay exactly in recorded mode only.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from reprorl.config.engine import VllmEngine
from reprorl.errors import InferenceError
from reprorl.policy.http import HttpSampler
from reprorl.policy.logprob_probe import LogprobsMode, probe_logprobs
from reprorl.policy.transport import Endpoint, Reply, RetryPolicy
from reprorl.policy.vllm_server import BASE_NAME, Launch, VllmServer, local_launch, server_args

Event = Callable[..., None]


def adapter_dirname(version: str) -> str:
    """The folder name a version's adapter is saved under for the servers to load (no ':' in it)."""
    return version.replace(":", "-")


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
        lora_rank: int | None,
        log_dir: Path | None = None,
        on_event: Event | None = None,
        launch: Launch | None = None,
    ) -> None:
        """`launch`: how the servers reprorl owns are started (children of this process by default;
        Ray actors on a cluster)."""
        self.spec = spec
        self.on_event = on_event or (lambda kind, **fields: None)
        if spec.urls:
            self.servers = [VllmServer(i, url=u) for i, u in enumerate(spec.urls)]
        else:
            if model_dir is None:
                raise ValueError("a vLLM server reprorl starts needs the base model's folder")
            argv, env = server_args(spec, model_dir, dtype=dtype, seed=seed, lora_rank=lora_rank)
            launch = launch or local_launch(spec.startup_timeout_s, log_dir)
            self.servers = [VllmServer(i, process=launch(i, argv, env)) for i in range(spec.servers)]
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._replacing: dict[int, threading.Lock] = {s.index: threading.Lock() for s in self.servers}
        self.mismatches = 0
        self.replaced = 0
        self.dropped: set[int] = set()  # attached servers that went down
        self._endpoints: dict[int, tuple[str, Endpoint]] = {}
        self.engine_version = ""
        self.logprobs_mode: LogprobsMode | None = None  # set by `probe_logprobs`
        self.reported: dict[str, Any] | None = None  # a view's record: the engine it asks on behalf of

    def start(self) -> None:
        """Start (or check) every server, in parallel: a vLLM start takes a while."""
        with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
            list(pool.map(lambda s: s.start(), self.servers))
        self.engine_version = self.servers[0].version()

    def probe_logprobs(self) -> LogprobsMode:
        """Which logprobs the servers return (`reprorl.policy.logprob_probe`): "raw" if any server's
        are, "processed" if every server's are, else "unknown"; kept, and recorded by `info`."""
        modes = {
            probe_logprobs(partial(self._endpoint(s).post, "/completions"), BASE_NAME)
            for s in self.servers
            if s.index not in self.dropped
        }
        self.logprobs_mode = "raw" if "raw" in modes else "processed" if modes == {"processed"} else "unknown"
        return self.logprobs_mode

    def close(self) -> None:
        for server in self.servers:
            server.kill()
        for _, endpoint in self._endpoints.values():
            endpoint.close()
        self._endpoints.clear()

    def info(self) -> dict[str, Any]:
        """What the record says of the engine (every rollout's sampler carries it)."""
        if self.reported is not None:
            return dict(self.reported)
        return {
            "kind": "vllm",
            "engine": "vllm",
            "engine_version": self.engine_version,
            "servers": len(self.servers),
            "attached": list(self.spec.urls),
            "batch_invariant": self.spec.batch_invariant,
            "extra_args": list(self.spec.extra_args),
            "deterministic": self.spec.batch_invariant,
            **({"logprobs": self.logprobs_mode} if self.logprobs_mode is not None else {}),
        }

    def placement(self) -> list[dict[str, Any]]:
        """Where each server runs: its URL, and for one a Ray actor placed, the node and GPUs."""
        return [
            {"server": s.index, "url": s.url, **dict(getattr(s.child, "placed", None) or {})}
            for s in self.servers
        ]

    # -- versions ------------------------------------------------------------------------------

    def publish(
        self, name: str, folder: Path, policy_version: str, *, folder_hash: str | None = None
    ) -> EngineSampler:
        """Load the adapter in `folder` as `name` into every server; a sampler that requests it.
        `folder_hash` (the folder's tree hash) goes in the event, so a later reader can check it."""
        for server in self.servers:
            self._on_live(server, lambda s: s.load(name, folder))
        self.on_event("engine_loaded", adapter=name, folder_hash=folder_hash, **self.held())
        return EngineSampler(self, name, policy_version)

    def publish_weights(self, version: str, folder: Path, *, folder_hash: str | None = None) -> EngineSampler:
        """Full fine-tuning: every server reloads its weights from the model saved in `folder`; a
        sampler whose requests only a server holding `version` may answer. A server holds one set of
        weights, so versions do not overlap: the caller publishes only once nothing samples the old."""
        for server in self.servers:
            self._on_live(server, lambda s: s.reload(version, folder))
        self.on_event("engine_reloaded", weights=version, folder_hash=folder_hash, **self.held())
        return EngineSampler(self, BASE_NAME, version, weights=version)

    def retire(self, name: str) -> None:
        for server in self.servers:
            if server.healthy():
                server.unload(name)
            else:
                server.loaded.pop(name, None)

    def held(self) -> dict[str, Any]:
        """What each server says it serves now (`/v1/models`), as `served`; a server that does not
        answer (it died since: the next request replaces it) under `unreachable`, with why."""
        served: dict[str, list[str]] = {}
        unreachable: dict[str, str] = {}
        for server in self.servers:
            if server.index in self.dropped:
                continue
            try:
                served[str(server.index)] = server.models()
            except InferenceError as exc:
                unreachable[str(server.index)] = str(exc)[:300]
        return {"served": served, **({"unreachable": unreachable} if unreachable else {})}

    # -- requests ------------------------------------------------------------------------------

    def post(self, body: dict[str, Any], *, weights: str | None = None) -> Reply:
        """Send one completion request to the next server that answers; replace one that died.
        With `weights` (full fine-tuning) the server must hold that version of the weights."""
        failures: list[str] = []
        for _ in range(len(self.servers) + 1):
            live = [s for s in self.servers if s.index not in self.dropped]
            if not live:
                break
            server = live[next(self._turn) % len(live)]
            if weights is not None and (server.weights is None or server.weights[0] != weights):
                held = server.weights[0] if server.weights else None
                self._mismatch(server, weights, held)
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
                self._mismatch(server, body["model"], answered)
            return reply
        raise InferenceError("no vLLM server could answer: " + "; ".join(failures)[:800])

    def _mismatch(self, server: VllmServer, asked: object, got: object) -> None:
        with self._lock:
            self.mismatches += 1
        self.on_event("vllm_version_mismatch", server=server.index, asked=asked, got=got)
        raise VersionMismatch(f"vLLM server {server.index} answered from {got!r}, not {asked!r}")

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
            self.on_event(
                "vllm_server_replaced",
                server=server.index,
                adapters=sorted(server.loaded),
                placed=dict(getattr(server.child, "placed", None) or {"url": server.url}),
            )


@dataclass(frozen=True)
class ServedVersion:
    """A published version as another process (a Ray rollout worker) needs it to ask the engine's
    servers for it: the name the servers serve it under, their URLs, and the engine's record."""

    version: str
    model: str
    weights: str | None
    urls: tuple[str, ...]
    info: dict[str, Any]

    @classmethod
    def of(cls, sampler: EngineSampler) -> ServedVersion:
        engine = sampler.engine
        urls = tuple(s.url for s in engine.servers if s.index not in engine.dropped)
        return cls(sampler.policy_version, sampler.model, sampler.weights, urls, engine.info())

    def sampler(self, spec: VllmEngine) -> EngineSampler:
        """A sampler of this version through a view of the servers (attached: a dead one is
        dropped here, and the engine that owns it replaces it before the next version)."""
        view = RolloutEngine(
            spec.model_copy(update={"urls": self.urls}), model_dir=None, dtype="", seed=0, lora_rank=None
        )
        view.reported, view.engine_version = self.info, str(self.info.get("engine_version", ""))
        if self.weights is not None:  # the owner reloaded these weights into every server it lists
            for server in view.servers:
                server.weights = (self.weights, Path())
        return EngineSampler(view, self.model, self.version, weights=self.weights, owns_engine=True)


class EngineSampler(HttpSampler):
    """An `HttpSampler` of one adapter, its requests sent through the engine's servers."""

    def __init__(
        self,
        engine: RolloutEngine,
        adapter: str,
        policy_version: str,
        *,
        weights: str | None = None,
        owns_engine: bool = False,
    ) -> None:
        super().__init__(
            engine.servers[0].url,  # unused: requests go through the engine
            adapter,
            policy_version=policy_version,
            timeout_s=engine.spec.timeout_s,
            max_concurrency=64,
        )
        self.engine = engine
        self.weights = weights  # full fine-tuning: the weights' version a server must hold
        self.owns_engine = owns_engine

    def close(self) -> None:
        super().close()
        if self.owns_engine:
            self.engine.close()

    def info(self) -> dict[str, Any]:
        extra = {"weights": self.weights} if self.weights is not None else {}
        return {**self.engine.info(), "model": self.model, **extra}

    def _post(self, body: dict[str, Any]) -> Reply:
        return self.engine.post(body, weights=self.weights)
