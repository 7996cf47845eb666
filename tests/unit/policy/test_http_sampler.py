"""HttpSampler and ChatClient against a real local HTTP server that fails, refuses, hangs or answers."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from reprorl.actions import CLOSE, parse_action
from reprorl.errors import InferenceError, UserInputError
from reprorl.policy.http import ChatClient, HttpSampler, RetryPolicy
from reprorl.policy.logprob_probe import check_logprobs
from reprorl.policy.sampling import SampleRequest
from reprorl.types import Message, Role, SamplingParams, ToolCall

FAST = RetryPolicy(retries=3, backoff_s=0.01, max_backoff_s=0.02)
HANG = "hang"
Payload = dict[str, Any] | bytes | Callable[[dict[str, Any]], dict[str, Any]]
Action = tuple[int, Payload] | str


def completion(body: dict[str, Any]) -> dict[str, Any]:
    """A vLLM-style answer whose first token echoes the prompt's first id, so rows can be told apart."""
    first = body["prompt"][0]
    return {
        "choices": [
            {
                "index": 0,
                "text": "ab",
                "logprobs": {"tokens": [f"token_id:{first}", "token_id:7"], "token_logprobs": [-0.5, -1.25]},
                "finish_reason": "length",
            }
        ]
    }


@dataclass
class Script:
    """What the server answers, in order; `default` once the list is used up."""

    actions: list[Action] = field(default_factory=list)
    default: Action = (200, completion)
    delay_s: float = 0.0
    hits: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    most_in_flight: int = 0  # the most requests being answered at once

    def paths(self) -> list[str]:
        return [path for path, _, _ in self.hits]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        script = self.server.script
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        with script.lock:
            script.hits.append((self.path, body, {k.lower(): v for k, v in self.headers.items()}))
            action = script.actions.pop(0) if script.actions else script.default
        if action == HANG:
            script.release.wait(10)
            return
        assert isinstance(action, tuple)
        with script.lock:
            script.in_flight += 1
            script.most_in_flight = max(script.most_in_flight, script.in_flight)
        time.sleep(script.delay_s)
        with script.lock:
            script.in_flight -= 1
        status, payload = action
        if callable(payload):
            payload = payload(body)
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        if status == 429:
            self.send_header("retry-after", "0")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, script: Script) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = script


@dataclass
class Fake:
    script: Script
    url: str


@pytest.fixture
def fake() -> Iterator[Fake]:
    script = Script()
    server = _Server(script)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield Fake(script, f"http://127.0.0.1:{server.server_address[1]}/v1")
    finally:
        script.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def request(key: str = "r0", prompt: tuple[int, ...] = (3, 4), **params: Any) -> SampleRequest:
    return SampleRequest(key=key, prompt_ids=prompt, params=SamplingParams(max_tokens=8, **params), seed=11)


def sampler(fake: Fake, **kwargs: Any) -> HttpSampler:
    kwargs.setdefault("retry", FAST)
    kwargs.setdefault("timeout_s", 5.0)
    return HttpSampler(fake.url, "m", policy_version="base:sha256:x", **kwargs)


def test_sends_token_ids_and_parses_token_ids_logprobs_and_finish(fake: Fake) -> None:
    with sampler(fake) as s:
        [sample] = s.sample([request(top_k=5, temperature=0.7)])
    assert (sample.key, sample.token_ids, sample.logprobs) == ("r0", (3, 7), (-0.5, -1.25))
    assert (sample.text, sample.finish_reason, sample.policy_version, sample.batch) == (
        "ab",
        "length",
        "base:sha256:x",
        (),
    )
    path, body, _ = fake.script.hits[0]
    assert path == "/v1/completions"
    assert body["prompt"] == [3, 4] and body["seed"] == 11 and body["max_tokens"] == 8
    assert (body["temperature"], body["top_p"], body["top_k"], body["logprobs"]) == (0.7, 1.0, 5, 1)
    assert body["stop"] == [CLOSE] and body["include_stop_str_in_output"] is True
    assert body["return_tokens_as_token_ids"] is True and body["return_token_ids"] is True
    assert body["skip_special_tokens"] is True  # the text, as the rollout layer parses it


def test_top_k_is_sent_only_when_set(fake: Fake) -> None:
    with sampler(fake) as s:
        s.sample([request()])
    assert "top_k" not in fake.script.hits[0][1]


def test_server_errors_are_retried_until_an_answer(fake: Fake) -> None:
    fake.script.actions = [(500, {"error": "boom"}), (503, b"busy"), (429, {"error": "slow down"})]
    with sampler(fake) as s:
        [sample] = s.sample([request()])
    assert sample.token_ids == (3, 7)
    assert len(fake.script.hits) == 4


def test_retries_are_bounded_then_an_inference_error(fake: Fake) -> None:
    fake.script.default = (502, {"error": "bad gateway"})
    with (
        sampler(fake, retry=RetryPolicy(retries=2, backoff_s=0.01)) as s,
        pytest.raises(InferenceError) as caught,
    ):
        s.sample([request()])
    assert len(fake.script.hits) == 3
    assert (caught.value.attempts, caught.value.status) == (3, 502)
    assert "after 3 attempts" in str(caught.value) and "HTTP 502" in str(caught.value)


def test_client_errors_are_not_retried(fake: Fake) -> None:
    fake.script.default = (400, {"error": {"message": "prompt too long"}})
    with sampler(fake) as s, pytest.raises(InferenceError) as caught:
        s.sample([request()])
    assert len(fake.script.hits) == 1
    assert (caught.value.status, caught.value.attempts) == (400, 1)
    assert "prompt too long" in str(caught.value)


def test_a_hanging_server_hits_the_timeout_and_each_attempt_counts(fake: Fake) -> None:
    fake.script.default = HANG
    start = time.monotonic()
    with (
        sampler(fake, timeout_s=0.2, retry=RetryPolicy(retries=1, backoff_s=0.01)) as s,
        pytest.raises(InferenceError) as caught,
    ):
        s.sample([request()])
    assert time.monotonic() - start < 3.0
    assert len(fake.script.hits) == 2
    assert caught.value.status is None and "Timeout" in str(caught.value)


def test_a_hang_then_an_answer_succeeds(fake: Fake) -> None:
    fake.script.actions = [HANG]
    with sampler(fake, timeout_s=0.2) as s:
        [sample] = s.sample([request()])
    assert sample.token_ids == (3, 7) and len(fake.script.hits) == 2


def test_nobody_listening_is_retried_then_an_inference_error() -> None:
    # A port that was just free: connections are refused.
    with _Server(Script()) as probe:
        port = probe.server_address[1]
    with (
        HttpSampler(f"http://127.0.0.1:{port}/v1", "m", retry=RetryPolicy(retries=2, backoff_s=0.01)) as s,
        pytest.raises(InferenceError) as caught,
    ):
        s.sample([request()])
    assert caught.value.attempts == 3 and "ConnectError" in str(caught.value)


def test_a_body_that_is_not_json_is_an_inference_error_without_retry(fake: Fake) -> None:
    fake.script.default = (200, b"<html>proxy error</html>")
    with sampler(fake) as s, pytest.raises(InferenceError, match="not a JSON object"):
        s.sample([request()])
    assert len(fake.script.hits) == 1


def test_missing_token_ids_or_logprobs_give_empty_tuples(fake: Fake) -> None:
    fake.script.actions = [
        (200, {"choices": [{"text": "hello", "finish_reason": "stop"}]}),
        (200, {"choices": [{"text": "hi", "logprobs": {"tokens": ["hi"], "token_logprobs": [None]}}]}),
    ]
    with sampler(fake) as s:
        bare = s.sample([request()])[0]
        strings = s.sample([request()])[0]
    assert (bare.token_ids, bare.logprobs, bare.text, bare.finish_reason) == ((), (), "hello", "stop")
    assert (strings.token_ids, strings.logprobs, strings.text) == ((), (), "hi")


def test_token_ids_listed_on_the_choice_are_used_when_logprob_tokens_are_text(fake: Fake) -> None:
    # SGLang's return_token_ids: ids beside the text, logprob tokens as strings.
    choice = {
        "text": "hi!",
        "token_ids": [12, 13],
        "logprobs": {"tokens": ["hi", "!"], "token_logprobs": [-0.1, -0.2]},
        "finish_reason": "stop",
    }
    fake.script.default = (200, {"choices": [choice]})
    with sampler(fake) as s:
        [sample] = s.sample([request()])
    assert (sample.token_ids, sample.logprobs) == ((12, 13), (-0.1, -0.2))


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"text": "x", "finish_reason": "length"}, "length"),
        ({"text": f"x{CLOSE}", "finish_reason": "length"}, "length"),
        ({"text": "x", "finish_reason": "stop", "stop_reason": CLOSE}, "tool_call"),
        ({"text": f"x{CLOSE}", "finish_reason": "stop", "stop_reason": None}, "tool_call"),
        ({"text": "x", "finish_reason": "stop", "matched_stop": CLOSE}, "tool_call"),
        ({"text": "x", "finish_reason": "stop", "stop_reason": 2}, "stop"),
    ],
)
def test_finish_reasons(fake: Fake, choice: dict[str, Any], expected: str) -> None:
    fake.script.default = (200, {"choices": [choice]})
    with sampler(fake) as s:
        assert s.sample([request()])[0].finish_reason == expected


def test_a_batch_runs_concurrently_and_keeps_its_order(fake: Fake) -> None:
    fake.script.delay_s = 0.3
    requests = [request(f"r{i}", (100 + i, 1)) for i in range(6)]
    with sampler(fake) as s:
        samples = s.sample(requests)
    assert fake.script.most_in_flight > 1  # requests overlapped (counted, not timed: the box is shared)
    assert [x.key for x in samples] == [r.key for r in requests]
    assert [x.token_ids[0] for x in samples] == [100 + i for i in range(6)]


def test_one_failing_row_fails_the_batch(fake: Fake) -> None:
    fake.script.actions = [(200, completion), (404, {"error": "no such model"})]
    with sampler(fake) as s, pytest.raises(InferenceError, match="404"):
        s.sample([request("a"), request("b")])


def test_duplicate_keys_and_empty_batches(fake: Fake) -> None:
    with sampler(fake) as s:
        assert s.sample([]) == []
        with pytest.raises(ValueError, match="distinct keys"):
            s.sample([request("same"), request("same")])
    assert fake.script.hits == []


def test_backoff_doubles_up_to_its_cap_and_honours_retry_after() -> None:
    policy = RetryPolicy(retries=5, backoff_s=0.5, max_backoff_s=4.0)
    assert [policy.delay(i) for i in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert policy.delay(0, retry_after=3.0) == 3.0
    assert policy.delay(0, retry_after=60.0) == 4.0


def test_api_key_comes_from_the_environment_and_stays_out_of_info(
    fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPRORL_TEST_KEY", "sk-secret")
    with sampler(fake, api_key_env="REPRORL_TEST_KEY") as s:
        s.sample([request()])
        info = s.info()
    assert fake.script.hits[0][2]["authorization"] == "Bearer sk-secret"
    assert info == {"kind": "http", "base_url": fake.url, "model": "m"}
    assert "sk-secret" not in json.dumps(info) and "sk-secret" not in json.dumps(vars(s), default=str)
    monkeypatch.delenv("REPRORL_TEST_KEY")
    with pytest.raises(UserInputError, match="REPRORL_TEST_KEY"):
        sampler(fake, api_key_env="REPRORL_TEST_KEY")


def test_a_url_without_http_is_refused() -> None:
    with pytest.raises(UserInputError, match="http"):
        HttpSampler("localhost:8000/v1", "m")


def chat_reply(body: dict[str, Any]) -> dict[str, Any]:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "calc", "arguments": '{"expression": "2+2"}'},
    }
    return {
        "choices": [
            {
                "message": {"role": "assistant", "content": "Let me compute.", "tool_calls": [call]},
                "logprobs": {
                    "content": [
                        {"token": "token_id:9", "logprob": -0.25},
                        {"token": "token_id:4", "logprob": -2.0},
                    ]
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 31, "completion_tokens": 2, "total_tokens": 33},
    }


def test_chat_client_shares_retries_and_maps_native_tool_calls_to_text(fake: Fake) -> None:
    fake.script.actions = [(503, {"error": "warming up"})]
    fake.script.default = (200, chat_reply)
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    history = [
        Message(role=Role.USER, content="2+2?"),
        Message(
            role=Role.ASSISTANT,
            content='thinking<tool_call>{"name": "calc", "arguments": {"expression": "2+2"}}</tool_call>',
            tool_calls=(ToolCall(id="c0", name="calc", arguments={"expression": "2+2"}),),
        ),
        Message(role=Role.TOOL, content="4", tool_call_id="c0", name="calc"),
    ]
    with ChatClient(fake.url, "gpt-x", retry=FAST, timeout_s=5.0) as client:
        reply = client.complete(history, tools, SamplingParams(temperature=0.5, max_tokens=64), seed=5)
    assert len(fake.script.hits) == 2
    path, body, _ = fake.script.hits[-1]
    assert path == "/v1/chat/completions"
    assert (body["model"], body["seed"], body["max_tokens"], body["logprobs"], body["top_logprobs"]) == (
        "gpt-x",
        5,
        64,
        True,
        0,
    )
    assert body["tools"] == tools and "top_k" not in body and "return_tokens_as_token_ids" not in body
    sent = body["messages"][1]
    assert sent["content"] == "thinking" and sent["tool_calls"][0]["function"]["name"] == "calc"
    assert json.loads(sent["tool_calls"][0]["function"]["arguments"]) == {"expression": "2+2"}
    assert body["messages"][2] == {"role": "tool", "content": "4", "tool_call_id": "c0", "name": "calc"}
    assert reply.text.startswith("Let me compute.<tool_call>") and reply.text.endswith(CLOSE)
    action = parse_action(reply.text)
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("calc", {"expression": "2+2"})]
    assert (reply.token_ids, reply.logprobs, reply.finish_reason) == ((9, 4), (-0.25, -2.0), "tool_call")
    assert (reply.prompt_tokens, reply.completion_tokens) == (31, 2)


def test_chat_client_sends_extensions_only_when_asked_and_tolerates_bare_replies(fake: Fake) -> None:
    fake.script.default = (200, {"choices": [{"message": {"content": "4"}, "finish_reason": "stop"}]})
    extra = {"return_tokens_as_token_ids": True}
    with ChatClient(fake.url, "m", retry=FAST, extra_body=extra) as client:
        reply = client.complete(
            [Message(role=Role.USER, content="2+2?")], [], SamplingParams(top_k=3), seed=1
        )
    body = fake.script.hits[0][1]
    assert body["return_tokens_as_token_ids"] is True and body["top_k"] == 3 and "tools" not in body
    assert (reply.text, reply.token_ids, reply.logprobs, reply.finish_reason) == ("4", (), (), "stop")
    assert reply.prompt_tokens is None


def test_chat_client_refusal_is_not_retried(fake: Fake) -> None:
    fake.script.default = (401, {"error": "bad key"})
    with ChatClient(fake.url, "m", retry=FAST) as client, pytest.raises(InferenceError) as caught:
        client.complete([Message(role=Role.USER, content="hi")], [], SamplingParams(), seed=0)
    assert caught.value.status == 401 and len(fake.script.hits) == 1


LOGITS = {"token_id:3": 2.0, "token_id:4": 1.0, "token_id:5": 0.5, "token_id:6": 0.0, "token_id:7": -1.0}


def top_logprobs(scaled: bool) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A server whose top logprobs are log-softmax of fixed logits, divided by the temperature or not."""

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        t = float(body["temperature"]) if scaled else 1.0
        total = math.log(sum(math.exp(z / t) for z in LOGITS.values()))
        top = {k: z / t - total for k, z in LOGITS.items()}
        lp = {"tokens": ["token_id:3"], "token_logprobs": [top["token_id:3"]], "top_logprobs": [top]}
        return {"choices": [{"text": "a", "logprobs": lp, "finish_reason": "length"}]}

    return answer


@pytest.mark.parametrize(("scaled", "mode"), [(True, "processed"), (False, "raw")])
def test_the_probe_tells_logprobs_after_temperature_from_raw_ones(
    fake: Fake, scaled: bool, mode: str
) -> None:
    fake.script.default = (200, top_logprobs(scaled))
    s = sampler(fake)
    assert "logprobs" not in s.info()
    assert s.probe_logprobs() == mode and s.info()["logprobs"] == mode
    bodies = [body for _, body, _ in fake.script.hits]
    assert [b["temperature"] for b in bodies] == [1.0, 0.5] and all(b["max_tokens"] == 1 for b in bodies)


def test_a_server_without_top_logprobs_or_failing_leaves_the_mode_unknown(fake: Fake) -> None:
    assert sampler(fake).probe_logprobs() == "unknown"  # the default answer has no top logprobs
    fake.script.default = (400, {"error": {"message": "logprobs not supported"}})
    assert sampler(fake).probe_logprobs() == "unknown"


def test_raw_logprobs_are_refused_only_where_the_trainer_scores_otherwise() -> None:
    for temperature in (0.0, 1.0):
        check_logprobs("raw", temperature, where="the server", field="model.vllm.urls")
    for mode in ("processed", "unknown"):
        check_logprobs(mode, 0.7, where="the server", field="model.vllm.urls")  # type: ignore[arg-type]
    with pytest.raises(UserInputError, match="--logprobs-mode processed_logprobs") as refused:
        check_logprobs("raw", 0.7, where="the server", field="model.vllm.urls")
    assert refused.value.field == "model.vllm.urls" and "learning.temperature = 0.7" in str(refused.value)
