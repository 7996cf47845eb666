"""The `reprorl` entry point: global options, sub-commands, and one-line errors with exit code 2."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import typer

from reprorl.cli import (
    artifacts_cmd,
    demo_cmd,
    eval_cmd,
    replay_cmd,
    reproduce_cmd,
    rewards_group,
    run_cmd,
    runs_group,
    sample_cmd,
    serve_group,
    spec_cmd,
    tasks_group,
)
from reprorl.cli.context import Options
from reprorl.cli.output import err_console, one_line
from reprorl.errors import ReprorlError, SpecError

EXIT_ERROR = 2

app = typer.Typer(
    name="reprorl",
    help="Reinforcement learning for tool-using agents, where every result traces to its conditions.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# One entry per noun or main verb; a new command joins its group's module, not this list.
app.command("run")(run_cmd.run)
app.command("sample")(sample_cmd.sample)
app.command("eval")(eval_cmd.eval_)
app.command("replay")(replay_cmd.replay)
app.command("reproduce")(reproduce_cmd.reproduce)
app.command("demo")(demo_cmd.demo)
app.add_typer(spec_cmd.app, name="spec")
app.add_typer(artifacts_cmd.app, name="artifacts")
app.add_typer(runs_group.app, name="runs")
app.add_typer(rewards_group.app, name="rewards")
app.add_typer(tasks_group.app, name="tasks")
app.add_typer(serve_group.app, name="serve")


@app.callback()
def _root(
    ctx: typer.Context,
    home: Path | None = typer.Option(
        None, "--home", envvar="REPRORL_HOME", help="Store root (default ~/.reprorl)."
    ),
    db_url: str | None = typer.Option(
        None,
        "--db-url",
        envvar="REPRORL_DB_URL",
        help="Registry database URL (default SQLite in the store root).",
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
) -> None:
    ctx.obj = Options(home=home, db_url=db_url, debug=debug)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; every failure becomes one line on stderr and exit code 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    command = typer.main.get_command(app)
    try:
        result = command.main(args=args, prog_name="reprorl", standalone_mode=False)
    except typer.Exit as done:
        return int(done.exit_code)
    except typer.Abort:
        err_console.print("error: aborted")
        return EXIT_ERROR
    except typer.TyperException as exc:  # usage errors: unknown command, bad option value, ...
        if not exc.format_message().strip():
            return 0  # no arguments: the help text was shown, nothing went wrong
        _report(_usage_message(exc), debug)
        return EXIT_ERROR
    except SpecError as exc:  # every problem of a spec, one line each
        for line in exc.problems if len(exc.problems) > 1 else (str(exc),):
            _report(line, debug)
            debug = False  # one traceback is enough
        return EXIT_ERROR
    except ReprorlError as exc:
        _report(str(exc), debug)
        return EXIT_ERROR
    except KeyboardInterrupt:
        err_console.print("error: interrupted")
        return 130
    except Exception as exc:  # a bug, not bad input: still one line unless --debug
        _report(
            f"internal error ({type(exc).__name__}): {exc} — rerun with --debug for the traceback",
            debug,
        )
        return EXIT_ERROR
    return int(result) if isinstance(result, int) else 0


def _usage_message(exc: typer.TyperException) -> str:
    param = getattr(exc, "param", None)
    names = getattr(param, "opts", None) or []
    message = exc.format_message()
    if names and names[0] not in message:
        message = f"{names[0]}: {message}"
    return message


def _report(message: str, debug: bool) -> None:
    if debug:
        traceback.print_exc()
    sys.stderr.write(f"error: {one_line(message)}\n")


def entry() -> None:
    sys.exit(main())
