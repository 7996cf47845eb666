"""`reprorl serve policy` as a real subprocess, sampled through HttpSampler and ChatClient over HTTP."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from reprorl.policy import apply_lora, load_adapter, save_adapter, tiny_model
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.http import ChatClient, HttpSampler
from reprorl.policy.sampling import LocalSampler, SampleRequest
from reprorl.types import Message, Role, SamplingParams

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
PARAMS = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=24)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
CONVERSATION = [
    Message(role=Role.SYSTEM, content="You are a careful calculator."),
    Message(role=Role.USER, content="What is 17 * 23?"),
]


def reprorl_exe() -> str:
    exe = shutil.which("reprorl", path=str(Path(sys.executable).parent))
    assert exe is not None, "the reprorl console script is not installed in this environment"
    return exe


@dataclass
class Served:
    """A running `reprorl serve policy` and the line it announced itself with."""

    process: subprocess.Popen[str]
    url: str
    announced: str

    def get(self, path: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url.removesuffix('/v1')}{path}", timeout=10.0)
        response.raise_for_status()
        body = response.json()
        assert isinstance(body, dict)
        return body

    def model(self) -> str:
        return str(self.get("/v1/models")["data"][0]["id"])

    def sampler(self) -> HttpSampler:
        return HttpSampler(self.url, self.model(), timeout_s=60.0)


def _first_line(process: subprocess.Popen[str]) -> str:
    """The process's first line of output, or "" if it ends or stays silent too long."""
    lines: queue.Queue[str] = queue.Queue()
    stdout = process.stdout
    assert stdout is not None
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=START_TIMEOUT_S)
    except queue.Empty:
        return ""


@contextlib.contextmanager
def serving(home: Path, *args: str) -> Iterator[Served]:
    """Start the server on a free port, wait for its line, and stop it with SIGTERM afterwards."""
    log = home.parent / f"serve-{home.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [reprorl_exe(), "serve", "policy", "--port", "0", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "REPRORL_HOME": str(home)},
        )
    try:
        line = _first_line(process).strip()
        if not line.startswith("serving "):
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)
            pytest.fail(f"serve policy never announced itself (got {line!r}):\n{log.read_text()[-3000:]}")
        yield Served(process, line.rsplit(" on ", 1)[1], line)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STOP_TIMEOUT_S) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture(scope="module")
def base_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("serve") / "home", "--base", "tiny:0") as served:
        yield served


@pytest.fixture(scope="module")
def prompt_ids() -> list[int]:
    return ChatRenderer(tiny_model(0).tokenizer).prompt_ids(CONVERSATION, TOOLS)


def requests_for(prompt: list[int], seeds: list[int]) -> list[SampleRequest]:
    return [
        SampleRequest(key=f"row{i}", prompt_ids=tuple(prompt[: len(prompt) - i]), params=PARAMS, seed=seed)
        for i, seed in enumerate(seeds)
    ]


def test_announces_the_base_version_and_serves_models_and_health(base_server: Served) -> None:
    tiny = tiny_model(0)
    version = f"base:{tiny.base_hash}"
    assert base_server.announced == f"serving {tiny.name} ({version}) on {base_server.url}"
    assert base_server.url.startswith("http://127.0.0.1:")
    entry = base_server.get("/v1/models")["data"][0]
    assert (entry["id"], entry["policy_version"]) == (tiny.name, version)
    health = base_server.get("/health")
    assert health["status"] == "ok" and health["policy_version"] == version


def test_a_batch_of_token_prompts_gives_tokens_and_logprobs_reproducibly(
    base_server: Served, prompt_ids: list[int]
) -> None:
    requests = requests_for(prompt_ids, [101, 202, 303, 404])
    with base_server.sampler() as sampler:
        first = sampler.sample(requests)
        again = sampler.sample(requests)
    assert [s.key for s in first] == [r.key for r in requests]
    for sample in first:
        assert sample.token_ids and len(sample.token_ids) == len(sample.logprobs)
        assert all(lp <= 0.0 for lp in sample.logprobs)
        assert sample.policy_version == f"base:{tiny_model(0).base_hash}"
    assert len({s.token_ids for s in first}) == 4  # distinct seeds, distinct samples
    assert [s.token_ids for s in again] == [s.token_ids for s in first]


def test_served_tokens_are_bit_identical_to_an_in_process_local_sampler(
    base_server: Served, prompt_ids: list[int]
) -> None:
    [request] = requests_for(prompt_ids, [777])
    tiny = tiny_model(0)
    local = LocalSampler(tiny.model, tiny.tokenizer, model_hash=tiny.base_hash, policy_version="local")
    [expected] = local.sample([request])
    with base_server.sampler() as sampler:
        [served] = sampler.sample([request])
    assert served.token_ids == expected.token_ids
    assert served.logprobs == expected.logprobs  # exact floats, not approximately
    assert served.finish_reason == expected.finish_reason


def test_chat_completions_with_tools_render_the_conversation_and_return_text(
    base_server: Served, prompt_ids: list[int]
) -> None:
    extensions = {"return_tokens_as_token_ids": True}
    with ChatClient(base_server.url, base_server.model(), timeout_s=60.0, extra_body=extensions) as client:
        reply = client.complete(CONVERSATION, TOOLS, PARAMS, seed=9)
        again = client.complete(CONVERSATION, TOOLS, PARAMS, seed=9)
    assert reply.text.strip()
    assert reply.prompt_tokens == len(prompt_ids)  # rendered with the tools, as the renderer does
    assert reply.completion_tokens == len(reply.token_ids) == len(reply.logprobs) > 0
    assert (again.text, again.token_ids) == (reply.text, reply.token_ids)


def test_concurrent_requests_are_all_answered_in_fewer_batches(
    base_server: Served, prompt_ids: list[int]
) -> None:
    before = base_server.get("/health")
    requests = requests_for(prompt_ids, list(range(500, 508)))
    with base_server.sampler() as sampler:
        samples = sampler.sample(requests)
    after = base_server.get("/health")
    assert [s.key for s in samples] == [r.key for r in requests] and all(s.token_ids for s in samples)
    assert after["requests"] - before["requests"] == 8
    assert after["batches"] - before["batches"] < 8
    assert after["largest_batch"] > 1


def test_bad_requests_get_400_json_errors(base_server: Served) -> None:
    model = base_server.model()
    bad_bodies = [
        {"model": model, "prompt": [10**9]},
        {"model": model, "prompt": []},
        {"model": model, "prompt": [1, 2], "n": 0},
        {"model": model, "prompt": [1, 2], "n": 17},
        {"model": model, "prompt": [1, 2], "max_tokens": 0},
        {"model": model, "prompt": [1, 2], "stop": ["a", "b", "c", "d", "e"]},
        {"model": model, "prompt": [1, 2], "stop": [""]},
        {"model": model, "prompt": {"not": "a prompt"}},
    ]
    for body in bad_bodies:
        response = httpx.post(f"{base_server.url}/completions", json=body, timeout=10.0)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"]["message"], body
    garbled = httpx.post(
        f"{base_server.url}/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert garbled.status_code == 400 and "not valid JSON" in garbled.json()["error"]["message"]
    unknown = httpx.post(
        f"{base_server.url}/completions", json={"model": "other", "prompt": [1]}, timeout=10.0
    )
    assert unknown.status_code == 404


def test_an_adapter_is_served_with_its_own_version_and_changes_the_samples(
    tmp_path: Path, base_server: Served, prompt_ids: list[int]
) -> None:
    tiny = tiny_model(0)
    peft_model = apply_lora(tiny.model, rank=4, seed=3)
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5, generator=generator)
    folder = tmp_path / "adapter"
    adapter_hash = save_adapter(peft_model, folder, base_hash=tiny.base_hash)
    [request] = requests_for(prompt_ids, [31])

    fresh = tiny_model(0)
    merged = load_adapter(fresh.model, folder).merge_and_unload()
    [expected] = LocalSampler(
        merged, fresh.tokenizer, model_hash=fresh.base_hash, policy_version="local"
    ).sample([request])
    with base_server.sampler() as sampler:
        [base] = sampler.sample([request])
    with serving(tmp_path / "home", "--base", "tiny:0", "--adapter", str(folder)) as served:
        assert f"(adapter:{adapter_hash})" in served.announced
        with served.sampler() as sampler:
            [adapted] = sampler.sample([request])
        assert served.get("/health")["policy_version"] == f"adapter:{adapter_hash}"
    assert adapted.policy_version == f"adapter:{adapter_hash}"
    assert adapted.logprobs != base.logprobs and adapted.token_ids != base.token_ids
    assert (adapted.token_ids, adapted.logprobs) == (expected.token_ids, expected.logprobs)


def test_an_adapter_of_another_base_is_refused(tmp_path: Path) -> None:
    tiny = tiny_model(0)
    folder = tmp_path / "adapter"
    save_adapter(apply_lora(tiny.model, rank=2), folder, base_hash=tiny.base_hash)
    done = subprocess.run(
        [reprorl_exe(), "serve", "policy", "--base", "tiny:1", "--adapter", str(folder), "--port", "0"],
        capture_output=True,
        text=True,
        env={**os.environ, "REPRORL_HOME": str(tmp_path / "home")},
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "load it onto the base it was trained on" in done.stderr


def test_a_non_loopback_host_needs_allow_remote(tmp_path: Path) -> None:
    done = subprocess.run(
        [reprorl_exe(), "serve", "policy", "--base", "tiny:0", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        env={**os.environ, "REPRORL_HOME": str(tmp_path / "home")},
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert (
        done.stderr.startswith("error: --host 0.0.0.0 is not a loopback address")
        and "--allow-remote" in done.stderr
    )
    assert "Traceback" not in done.stderr


def test_a_sampling_run_can_sample_through_the_server(base_server: Served, tmp_path: Path) -> None:
    """`model.inference` sends every turn to the server; records keep its tokens and logprobs."""
    from importlib import resources

    from reprorl.cli.main import main
    from reprorl.policy import save_model
    from reprorl.store import Store
    from reprorl.store.rollout_query import RolloutStore

    tiny = tiny_model(0)
    save_model(tiny.model, tiny.tokenizer, tmp_path / "tiny")
    store = Store(tmp_path / "home")
    store.add("tiny", tmp_path / "tiny", kind="model")
    with resources.as_file(resources.files("reprorl") / "examples" / "calc-train.jsonl") as path:
        store.add("calc-train", path, kind="taskset")
    spec = tmp_path / "spec.toml"
    spec.write_text(
        'name = "remote"\nseed = 1\n'
        f'[model]\nowner = "o"\nbase = "tiny"\ninference = {{ url = "{base_server.url}", '
        f'model = "{base_server.model()}", timeout_s = 60 }}\n'
        '[data]\nowner = "o"\ntrain = "calc-train"\n'
        '[learning]\nowner = "o"\ngroup_size = 2\ntasks_per_step = 2\nmax_tokens = 12\nmax_turns = 2\n'
        '[evaluation]\nowner = "o"\nsuites = ["calc-train"]\n'
    )
    home = ["--home", str(tmp_path / "home")]
    assert main([*home, "sample", str(spec), "--no-progress"]) == 0
    (run,) = [p for p in (tmp_path / "home" / "runs").iterdir() if not p.name.startswith(".")]
    records = list(RolloutStore(run).trajectories())
    assert len(records) == 4
    for record in records:
        assert record.sampler["kind"] == "http" and record.sampler["base_url"] == base_server.url
        first = record.turns[0]
        assert len(first.token_ids) == len(first.logprobs) > 0
        assert first.policy_version == f"base:{tiny.base_hash}"
    assert main([*home, "replay", records[0].rollout_id]) == 2  # refused: the server's batches are unknown
