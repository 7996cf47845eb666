"""The vLLM rollout engine's own logic, around a stand-in completions server: an answer from another
adapter than the request named is refused and counted; an attached server that is down fails the
request as the platform's; the servers reprorl starts get the flags the spec asks for; specs the
engine cannot serve are refused naming the field."""

from __future__ import annotations

import json
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from reprorl.config import validate_spec
from reprorl.config.engine import VllmEngine
from reprorl.errors import InferenceError, UserInputError
from reprorl.local_server import LocalServer
from reprorl.orchestrate.run.engine import check_engine
from reprorl.policy.sampling import SampleRequest
from reprorl.policy.vllm_engine import RolloutEngine, VersionMismatch
from reprorl.policy.vllm_server import PYTHON_ENV, local_launch, server_args
from reprorl.types import SamplingParams


class Completions(BaseHTTPRequestHandler):
    answer_as: str | None = None  # the model the stand-in claims to have answered from
    models_fail = False  # /v1/models answers 500, as a server dying between two calls would fail

    def do_GET(self) -> None:
        if self.models_fail and self.path == "/v1/models":
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._send({"version": "stand-in"} if self.path == "/version" else {"data": []})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        model = self.answer_as or body.get("model") or body.get("lora_name")
        text = {"text": "hi", "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.5]}}
        self._send({"model": model, "choices": [{**text, "finish_reason": "stop"}]})

    def _send(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    Completions.answer_as = None
    Completions.models_fail = False


def request() -> SampleRequest:
    return SampleRequest(key="r/0", prompt_ids=(1, 2, 3), seed=7, params=SamplingParams(max_tokens=4))


def attached(url: str, events: list[tuple[str, dict[str, Any]]]) -> RolloutEngine:
    engine = RolloutEngine(
        VllmEngine(urls=(url,), retries=0),
        model_dir=None,
        dtype="float32",
        seed=0,
        lora_rank=4,
        on_event=lambda kind, **fields: events.append((kind, fields)),
    )
    engine.engine_version = "stand-in"
    return engine


def test_an_answer_from_another_adapter_is_refused_and_counted(stand_in: ThreadingHTTPServer) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    engine = attached(f"http://127.0.0.1:{stand_in.server_port}/v1", events)
    sampler = engine.publish("adapter:sha256:aa", Path("/adapters/aa"), "adapter:sha256:aa")
    (sample,) = sampler.sample([request()])
    assert sample.token_ids == (5,) and sample.policy_version == "adapter:sha256:aa"
    assert sampler.info()["kind"] == "vllm" and sampler.info()["model"] == "adapter:sha256:aa"
    Completions.answer_as = "adapter:sha256:bb"
    with pytest.raises(VersionMismatch, match="answered from 'adapter:sha256:bb', not 'adapter:sha256:aa'"):
        sampler.sample([request()])
    assert engine.mismatches == 1
    assert (
        "vllm_version_mismatch",
        {"server": 0, "asked": "adapter:sha256:aa", "got": "adapter:sha256:bb"},
    ) in events


def test_full_weights_are_reloaded_and_only_a_server_holding_them_may_answer(
    stand_in: ThreadingHTTPServer, tmp_path: Path
) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    engine = attached(f"http://127.0.0.1:{stand_in.server_port}/v1", events)
    first = engine.publish_weights("weights:sha256:aa", tmp_path / "aa", folder_hash="sha256:f1")
    (sample,) = first.sample([request()])
    assert sample.policy_version == "weights:sha256:aa" and first.info()["weights"] == "weights:sha256:aa"
    assert engine.servers[0].weights == ("weights:sha256:aa", tmp_path / "aa")
    assert (
        "engine_reloaded",
        {"weights": "weights:sha256:aa", "folder_hash": "sha256:f1", "served": {"0": []}},
    ) in events
    engine.publish_weights("weights:sha256:bb", tmp_path / "bb")
    # The server now holds bb: a request for aa's weights is refused before it is sent.
    with pytest.raises(VersionMismatch, match="answered from 'weights:sha256:bb', not 'weights:sha256:aa'"):
        first.sample([request()])
    assert engine.mismatches == 1


def test_a_server_that_cannot_say_what_it_holds_is_recorded_so_and_the_load_stands(
    stand_in: ThreadingHTTPServer,
) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    engine = attached(f"http://127.0.0.1:{stand_in.server_port}/v1", events)
    Completions.models_fail = True
    sampler = engine.publish("adapter:sha256:aa", Path("/adapters/aa"), "adapter:sha256:aa")
    ((kind, fields),) = events
    assert kind == "engine_loaded" and fields["served"] == {} and "500" in fields["unreachable"]["0"]
    (sample,) = sampler.sample([request()])  # the report failed, not the server: it still answers
    assert sample.policy_version == "adapter:sha256:aa"


def test_an_attached_server_that_is_down_is_the_platforms_failure() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    engine = attached("http://127.0.0.1:9/v1", events)  # nothing listens on the discard port
    with pytest.raises(InferenceError, match="no vLLM server could answer: server 0: POST"):
        engine.post({"model": "adapter:sha256:aa", "prompt": [1]})
    assert [kind for kind, _ in events] == ["vllm_server_dropped"]  # not reprorl's to restart
    assert engine.dropped == {0}


def test_a_request_goes_on_to_the_next_attached_server_when_one_is_down(
    stand_in: ThreadingHTTPServer,
) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    engine = RolloutEngine(
        VllmEngine(urls=("http://127.0.0.1:9/v1", f"http://127.0.0.1:{stand_in.server_port}/v1"), retries=0),
        model_dir=None,
        dtype="float32",
        seed=0,
        lora_rank=4,
        on_event=lambda kind, **fields: events.append((kind, fields)),
    )
    answers = [engine.post({"model": "adapter:sha256:aa", "prompt": [1]}) for _ in range(4)]
    assert all(a.body["model"] == "adapter:sha256:aa" for a in answers)
    assert engine.dropped == {0} and [kind for kind, _ in events] == ["vllm_server_dropped"]


def test_the_servers_reprorl_starts_get_the_flags_the_spec_asks_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    monkeypatch.setenv(PYTHON_ENV, str(python))
    spec = VllmEngine(max_loras=5, batch_invariant=True, extra_args=("--enforce-eager",))
    argv, env = server_args(spec, tmp_path / "base", dtype="bfloat16", seed=11, lora_rank=32)
    assert argv[0] == str(python) and argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    rest = argv[3:]
    flags = {
        f: (rest[i + 1] if i + 1 < len(rest) and not rest[i + 1].startswith("--") else "")
        for i, f in enumerate(rest)
        if f.startswith("--")
    }
    assert flags["--model"] == str(tmp_path / "base") and flags["--host"] == "{host}"
    assert flags["--max-loras"] == "5" and flags["--max-lora-rank"] == "32" and flags["--seed"] == "11"
    assert flags["--dtype"] == "bfloat16" and "--enable-lora" in argv and argv[-1] == "--enforce-eager"
    assert flags["--logprobs-mode"] == "processed_logprobs"  # temperature-scaled, as the trainer's
    assert env["VLLM_BATCH_INVARIANT"] == "1" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    # The address goes in where the server starts: loopback unless a Ray node's is asked for.
    child = local_launch(60, None)(0, argv, env)
    assert env["VLLM_HOST_IP"] == "{host}" and isinstance(child, LocalServer)
    assert child.env["VLLM_HOST_IP"] == "127.0.0.1" and child.host == "127.0.0.1"
    assert (
        "VLLM_BATCH_INVARIANT"
        not in server_args(VllmEngine(), tmp_path, dtype="float32", seed=0, lora_rank=4)[1]
    )
    assert "VLLM_SERVER_DEV_MODE" not in env  # a LoRA run needs no development endpoints
    # Full fine-tuning: no LoRA, and the reload endpoint (/collective_rpc) is served.
    argv, env = server_args(VllmEngine(), tmp_path, dtype="float32", seed=0, lora_rank=None)
    assert "--enable-lora" not in argv and "--max-loras" not in argv and env["VLLM_SERVER_DEV_MODE"] == "1"


SPEC = """
name = "e"
seed = 0
[model]
owner = "t@x"
base = "sha256:{h}"
{adapter}
[model.vllm]
max_loras = {loras}
[data]
owner = "t@x"
train = "sha256:{h}"
[learning]
owner = "t@x"
{pipeline}
[evaluation]
owner = "t@x"
suites = ["sha256:{e}"]
"""


@pytest.mark.parametrize(
    ("adapter", "loras", "pipeline", "ray", "refused"),
    [
        ('adapter = { kind = "full" }', 4, "pipeline = { max_staleness = 1 }", None, "max_staleness = 0"),
        ('adapter = { kind = "full" }', 1, "pipeline = { max_staleness = 0 }", None, None),
        ("", 3, "pipeline = { max_staleness = 2 }", None, "model.vllm.max_loras = 3 cannot hold the 4"),
        ("", 4, "", "local", None),
        ("", 4, "pipeline = { max_staleness = 2 }", None, None),
    ],
)
def test_specs_the_engine_cannot_serve_are_refused_naming_the_field(
    adapter: str, loras: int, pipeline: str, ray: str | None, refused: str | None
) -> None:
    spec = validate_spec(
        tomllib.loads(SPEC.format(h="a" * 64, e="b" * 64, adapter=adapter, loras=loras, pipeline=pipeline))
    )
    if refused is None:
        check_engine(spec, ray=ray)
        return
    with pytest.raises(UserInputError, match=refused):
        check_engine(spec, ray=ray)


@pytest.mark.parametrize("field", ['host = "node"', "gpus_per_server = 1"])
def test_placing_servers_on_ray_nodes_needs_ray(field: str) -> None:
    text = SPEC.format(h="a" * 64, e="b" * 64, adapter="", loras=4, pipeline="")
    spec = validate_spec(tomllib.loads(text.replace("max_loras = 4", f"max_loras = 4\n{field}")))
    with pytest.raises(UserInputError, match="places servers on Ray nodes: run with --ray"):
        check_engine(spec)
    check_engine(spec, ray="local")
