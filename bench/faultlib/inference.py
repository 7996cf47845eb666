"""An inference server that fails: 5xx answers, requests that hang past the client's time limit, and
connections dropped before or in the middle of an answer.

A real HTTP server (`Flaky`) stands in front of a real `reprorl serve policy` and, by a seeded draw
per request, answers 503, hangs, drops the connection, cuts the answer short, or passes the request
on. A `reprorl sample` run sends every turn through it (`model.inference`, a short timeout and a
few retries); the reference is the same run straight against the server.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from faultlib import Trial, fault
from faultlib.harness import Bench, outcome, run_ids

TIMEOUT_S = 2.0
# Each request's fate: (share, kind). Retries are capped at 6, so 0.3 of failures per request leaves
# about 0.3^7 ≈ 2e-4 of turns failing for good; those would be recorded as infra errors.
FATES = ((0.12, "503"), (0.06, "hang"), (0.06, "drop"), (0.06, "cut"))


class Flaky(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, seed: int) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = upstream.rstrip("/").removesuffix("/v1")  # request paths carry /v1
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.injected: Counter[str] = Counter()
        self.client = httpx.Client(timeout=120.0)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up on a hung or cut answer closed its end first: expected here.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def fate(self) -> str:
        with self.lock:
            draw = self.rng.random()
            for share, kind in FATES:
                if draw < share:
                    self.injected[kind] += 1
                    return kind
                draw -= share
            return "pass"


class _Handler(BaseHTTPRequestHandler):
    server: Flaky
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _forward(self, method: str, body: bytes | None) -> httpx.Response:
        return self.server.client.request(
            method,
            self.server.upstream + self.path,
            content=body,
            headers={k: v for k, v in self.headers.items() if k.lower() in {"content-type", "authorization"}},
        )

    def _reply(self, status: int, body: bytes, *, cut: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if cut else body)
        if cut:
            self.wfile.flush()
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    def do_GET(self) -> None:
        answer = self._forward("GET", None)
        self._reply(answer.status_code, answer.content)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        fate = self.server.fate()
        if fate == "503":
            self._reply(
                503, json.dumps({"error": {"message": "overloaded", "type": "server_error"}}).encode()
            )
        elif fate == "hang":
            time.sleep(TIMEOUT_S + 1.0)
            self.close_connection = True
        elif fate == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        else:
            answer = self._forward("POST", body)
            self._reply(answer.status_code, answer.content, cut=fate == "cut")


@contextlib.contextmanager
def serving(bench: Bench) -> Iterator[str]:
    """`reprorl serve policy` of the tiny model on a free port; yields its /v1 URL."""
    log = (bench.logs / "serve-policy.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from reprorl.cli.main import main; sys.exit(main(sys.argv[1:]))",
            "--home",
            str(bench.root / "serve-home"),
            "serve",
            "policy",
            "--base",
            "tiny:0",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("serving "):
            raise RuntimeError(f"serve policy did not start: {line!r}")
        yield line.rsplit(" on ", 1)[1]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _sample_spec(bench: Bench, url: str, model: str, name: str, retries: int) -> Path:
    path = bench.root / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\nseed = 5\n'
        f'[model]\nowner = "o"\nbase = "tiny"\n'
        f'inference = {{ url = "{url}", model = "{model}", timeout_s = {TIMEOUT_S}, retries = {retries} }}\n'
        '[data]\nowner = "o"\ntrain = "calc-train"\n'
        '[learning]\nowner = "o"\ngroup_size = 2\ntasks_per_step = 8\nmax_tokens = 16\nmax_turns = 2\n'
        '[evaluation]\nowner = "o"\nsuites = ["calc-eval"]\n'
    )
    return path


def _sample(bench: Bench, name: str, spec: Path) -> tuple[Path, float, int]:
    home = bench.home(name)
    started = time.perf_counter()
    proc = bench.start(home, "sample", str(spec), "--steps", "2", "--no-progress")
    code = bench.finish(proc)
    return home, time.perf_counter() - started, code


@fault(
    "inference server faults", "503s, hangs past the timeout, dropped and cut connections (30% of requests)"
)
def flaky_server(bench: Bench, trials: int, rng: random.Random) -> list[Trial]:
    results: list[Trial] = []
    with serving(bench) as url:
        model = str(httpx.get(url + "/models", timeout=10).json()["data"][0]["id"])
        ref_home, ref_s, code = _sample(bench, "inference-ref", _sample_spec(bench, url, model, "direct", 0))
        if code != 0:
            raise RuntimeError("the reference sampling run failed")
        reference = outcome(ref_home)
        for i in range(trials):
            flaky = Flaky(url, rng.randrange(1 << 30))
            threading.Thread(target=flaky.serve_forever, daemon=True).start()
            try:
                spec = _sample_spec(
                    bench, f"http://127.0.0.1:{flaky.server_address[1]}/v1", model, f"flaky{i}", 6
                )
                home, took, code = _sample(bench, f"inference-{i}", spec)
            finally:
                flaky.shutdown()
                flaky.server_close()
            injected = sum(flaky.injected.values())
            notes = [f"{k} x{v}" for k, v in sorted(flaky.injected.items())]
            if code != 0:
                notes.append(f"exit {code}")
            if not run_ids(home):
                results.append(Trial(False, False, len(reference.rollouts), None, tuple(notes)))
                continue
            infra = sum(1 for r in outcome(home).rollouts.values() if r[2] == "infra_error")
            if infra:
                notes.append(f"{infra} rollouts recorded as infra errors")
            # The time a fault costs the run: the extra wall time over the reference, per fault.
            per_fault = max(took - ref_s, 0.0) / injected if injected else None
            results.append(bench.conclude(home, reference, notes, per_fault))
    return results
