"""`reprorl serve policy`: a base model, with an optional LoRA adapter, behind an OpenAI-compatible API."""

from __future__ import annotations

import ipaddress
import socket
import sys
from enum import StrEnum
from pathlib import Path

import typer

from reprorl.cli.context import options
from reprorl.cli.demo_cmd import BASE_MODEL_NAME
from reprorl.errors import UserInputError
from reprorl.hardware import resolve_dtype


class DType(StrEnum):
    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


def serve_policy(
    ctx: typer.Context,
    base: str = typer.Option(
        BASE_MODEL_NAME,
        "--base",
        help="Base model: the bundled model's name, a .gguf file or model folder, an artifact "
        "reference, or tiny:SEED for the tiny test model.",
    ),
    adapter: Path | None = typer.Option(
        None, "--adapter", help="A LoRA adapter folder (peft) to merge into the base."
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on (loopback unless --allow-remote)."
    ),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on; 0 picks a free one."),
    dtype: DType = typer.Option(
        DType.FLOAT32,
        "--dtype",
        help="Dtype of the weights while serving; auto: bfloat16 on CUDA and CPUs with AMX, else float32.",
    ),
    allow_remote: bool = typer.Option(
        False, "--allow-remote", help="Allow a non-loopback --host (the server has no authentication)."
    ),
) -> None:
    """Serve a policy at http://HOST:PORT/v1 until SIGINT or SIGTERM."""
    if not allow_remote and not is_loopback(host):
        raise UserInputError(
            f"--host {host} is not a loopback address and the server has no authentication; "
            "add --allow-remote to serve other machines"
        )
    # torch, transformers and uvicorn load only for this command, so the rest of the CLI starts quickly.
    import torch

    from reprorl.serve import bind, create_app, load_policy, run_server, url_of

    # Bound before the model loads, so a port in use fails at once.
    sock = bind(host, port)
    try:
        policy = load_policy(
            base,
            adapter=adapter,
            store=options(ctx).store(),
            dtype=torch.float32 if resolve_dtype(dtype.value) == "float32" else torch.bfloat16,
        )
        app = create_app(policy.sampler, policy.renderer, model_name=policy.name)
        ready = f"serving {policy.name} ({policy.policy_version}) on {url_of(sock)}\n"

        def announce() -> None:
            sys.stdout.write(ready)
            sys.stdout.flush()

        run_server(app, sock, on_started=announce)
    finally:
        sock.close()


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address or a name that resolves only to loopback addresses."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0])).is_loopback for info in infos)
