"""The CLI end to end: artifacts, specs, runs and the demo, with one-line errors and exit code 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.core import TyperGroup

from reprorl.cli.main import app

TASK = {"id": "t1", "family": "calculator", "prompt": [{"role": "user", "content": "What is 2 + 2?"}]}


from cli_support import Cli  # noqa: E402


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


def _command_tree() -> list[tuple[tuple[str, ...], Any]]:
    """Every command and group under `reprorl`, with its path, read from the click tree itself."""
    found: list[tuple[tuple[str, ...], Any]] = []

    def walk(command: Any, path: tuple[str, ...]) -> None:
        found.append((path, command))
        if isinstance(command, TyperGroup):
            for name, sub in command.commands.items():
                walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return found


def test_the_top_level_lists_at_most_twelve_commands(cli: Cli) -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    names = list(root.commands)
    assert 0 < len(names) <= 12, names
    assert not [name for name, command in root.commands.items() if command.hidden]
    code, out, _ = cli("--help")
    assert code == 0
    assert all(name in out for name in names), out
    # The commands that moved into a group are gone from the top level, with no alias left behind.
    for old in ("audit-rewards", "rollouts", "audit", "diff", "compare", "report", "review", "judge"):
        assert "No such command" in cli.error(old), old
    for old in ("verifier-errors", "screen", "regression", "export-metrics", "serve-policy"):
        assert "No such command" in cli.error(old), old


def test_every_command_and_subcommand_has_help(cli: Cli) -> None:
    tree = _command_tree()
    assert len(tree) > 30  # the walk reached the groups' commands, not only the top level
    for path, command in tree:
        assert (command.help or "").strip(), f"`reprorl {' '.join(path)}` has no help text"
        code, out, _ = cli(*path, "--help")
        assert code == 0, path
        assert "Usage" in out and "--help" in out, path


def test_reregistering_a_changed_task_set_under_the_same_file_name(cli: Cli, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(TASK) + "\n")
    first = cli.ok_json("artifacts", "add", "calc-train", str(tasks), "--kind", "taskset")
    # Same content, different formatting: same version and hash.
    tasks.write_text("\n" + json.dumps(TASK, indent=None, separators=(", ", ": ")) + "\n\n")
    same = cli.ok_json("artifacts", "add", "calc-train", str(tasks), "--kind", "taskset")
    assert (same["version"], same["hash"]) == (first["version"], first["hash"]) == ("v1", first["hash"])
    # Changed content under the same name and the same file name: a new version.
    tasks.write_text(json.dumps({**TASK, "prompt": [{"role": "user", "content": "What is 3 + 3?"}]}) + "\n")
    second = cli.ok_json("artifacts", "add", "calc-train", str(tasks), "--kind", "taskset")
    assert second["version"] == "v2" and second["hash"] != first["hash"]
    listed = cli.ok_json("artifacts", "list", "calc-train")
    assert [(v["version"], v["hash"]) for v in listed] == [("v1", first["hash"]), ("v2", second["hash"])]
    shown = cli.ok_json("artifacts", "show", "calc-train@v1")
    assert shown["hash"] == first["hash"] and shown["verified"] is True


def test_folder_artifact_with_lineage(cli: Cli, tmp_path: Path) -> None:
    base = tmp_path / "base.bin"
    base.write_bytes(b"weights")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    (adapter / "adapter_config.json").write_text("{}")
    base_v = cli.ok_json("artifacts", "add", "base", str(base), "--kind", "model")
    added = cli.ok_json(
        "artifacts", "add", "lora", str(adapter), "--kind", "adapter", "--parent", "base@v1:base_model"
    )
    shown = cli.ok_json("artifacts", "show", added["ref"])
    assert shown["files"] == ["adapter_config.json", "adapter_model.safetensors"]
    assert shown["parents"] == [{"hash": base_v["hash"], "relation": "base_model", "run_id": None}]
    assert cli.ok_json("artifacts", "show", "base@v1")["children"][0]["hash"] == added["hash"]


def test_corrupted_blob_is_one_line_naming_the_artifact(cli: Cli, tmp_path: Path) -> None:
    data = tmp_path / "model.bin"
    data.write_bytes(b"abcdefgh" * 1000)
    added = cli.ok_json("artifacts", "add", "tiny", str(data))
    digest = added["hash"].split(":")[1]
    obj = cli.home / "objects" / digest[:2] / digest[2:]
    obj.chmod(0o644)
    raw = bytearray(obj.read_bytes())
    raw[4321] ^= 0x01
    obj.write_bytes(bytes(raw))
    code, out, err = cli("artifacts", "show", "tiny@v1")
    assert code == 2 and out == ""
    line = _one_error_line(err)
    assert "tiny@v1" in line and "corrupt" in line


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["artifacts", "show", "nope@v1"], "nope@v1"),
        (["artifacts", "show", "nope@latest"], "floating label"),
        (["artifacts", "add", "x", "/does/not/exist"], "does not exist"),
        (["artifacts", "add", "bad name!", "."], "not a valid artifact name"),
        (["artifacts", "add", "x", ".", "--kind", "weird"], "--kind"),
        (["runs", "show", "2099"], "no run matches"),
        (["no-such-command"], "No such command"),
        (["runs", "list", "--limit", "0"], "--limit"),
    ],
)
def test_errors_are_one_line_with_exit_code_2(cli: Cli, args: list[str], needle: str) -> None:
    code, _out, err = cli(*args)
    assert code == 2
    assert needle in _one_error_line(err)


def test_debug_shows_the_traceback(cli: Cli) -> None:
    code, _, err = cli("--debug", "artifacts", "show", "nope@v1")
    assert code == 2
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: ")


def test_demo_records_a_run_that_runs_show_explains(cli: Cli) -> None:
    code, _out, err = cli("demo", "--record-only")
    assert code == 0, err
    runs = cli.ok_json("runs", "list")
    assert len(runs) == 1 and runs[0]["name"] == "calc-demo"
    shown = cli.ok_json("runs", "show", runs[0]["run_id"][:12])
    assert shown["status"]["status"] == "created"
    assert set(shown["inputs"]) == {"model.base", "data.train", "evaluation.suites[0]"}
    assert all(v.startswith("sha256:") for v in shown["inputs"].values())
    model = cli.ok_json("artifacts", "show", "smollm2-135m-instruct@v1")
    assert model["hash"] == shown["inputs"]["model.base"] and model["kind"] == "model"
    # A second demo reuses the same artifact versions and records a second run of the same spec.
    assert cli("demo", "--record-only")[0] == 0
    again = cli.ok_json("runs", "list")
    assert len(again) == 2 and again[0]["spec_hash"] == again[1]["spec_hash"]


def test_installed_entry_point_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    exe = shutil.which("reprorl", path=str(Path(sys.executable).parent))
    assert exe is not None, "the reprorl console script is not installed in this environment"
    spec = tmp_path / "spec.toml"
    spec.write_text('seed = "zero"\n')
    env = {**os.environ, "REPRORL_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [exe, "spec", "validate", str(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    # Every problem on a line of its own: the bad seed first, then each missing section.
    lines = done.stderr.splitlines()
    assert lines[0].startswith("error: seed: ") and len(lines) == 5
    assert [line.split(":", 2)[1].strip() for line in lines[1:]] == [
        "model",
        "data",
        "learning",
        "evaluation",
    ]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "home").exists()
