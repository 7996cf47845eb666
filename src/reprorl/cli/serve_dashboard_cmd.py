"""`reprorl serve dashboard`: the store's runs, rollouts, comparisons and artifacts in a browser, live."""

from __future__ import annotations

import sys

import typer

from reprorl.cli.context import options


def serve_dashboard(
    ctx: typer.Context,
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on; off loopback every request needs the token."
    ),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="Port to listen on; 0 picks a free one."),
    token: str | None = typer.Option(
        None,
        "--token",
        envvar="REPRORL_DASHBOARD_TOKEN",
        help="The token requests must carry (default: none on loopback, a new random one elsewhere).",
    ),
) -> None:
    """Serve the dashboard at http://HOST:PORT until SIGINT or SIGTERM; it never writes the store."""
    from reprorl.dashboard import serve_dashboard as serve

    def announce(url: str) -> None:
        sys.stdout.write(f"dashboard of {options(ctx).store().root} on {url}\n")
        sys.stdout.flush()

    serve(options(ctx).store(), host=host, port=port, token=token, on_started=announce)
