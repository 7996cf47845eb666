"""Tools: schemas from signatures, validation before running, versions that follow code and schema."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from reprorl.envs.tool import Tool, tool
from reprorl.types import Permission


@tool(Permission.READ, params={"path": "File to read.", "limit": "Max lines."})
def read_lines(ctx: Any, path: str, limit: int = 10) -> str:
    """Read the first lines of a file.

    Second paragraph is not part of the description.
    """
    return f"{path}:{limit}"


def test_schema_comes_from_the_signature() -> None:
    schema = read_lines.openai_schema()
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "read_lines"
    assert fn["description"] == "Read the first lines of a file."
    params = fn["parameters"]
    assert params["required"] == ["path"]
    assert params["properties"]["path"] == {"type": "string", "description": "File to read."}
    assert (
        params["properties"]["limit"]["type"] == "integer" and params["properties"]["limit"]["default"] == 10
    )
    assert params["additionalProperties"] is False


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({}, "'path' is a required property"),
        ({"path": 3}, "path: 3 is not of type 'string'"),
        ({"path": "a", "limit": "x"}, "limit: 'x' is not of type 'integer'"),
        ({"path": "a", "extra": 1}, "Additional properties are not allowed"),
    ],
)
def test_arguments_are_validated(arguments: dict[str, Any], problem: str) -> None:
    error = read_lines.argument_error(arguments)
    assert error is not None and problem in error


def test_valid_arguments_pass_and_the_tool_is_callable() -> None:
    assert read_lines.argument_error({"path": "a.txt", "limit": 3}) is None
    assert read_lines(SimpleNamespace(root="."), path="a.txt", limit=3) == "a.txt:3"
    assert read_lines.fn_ref == f"{__name__}:read_lines"


def test_version_changes_with_schema_permission_or_code() -> None:
    base = read_lines.version
    assert Tool(**{**_fields(read_lines), "description": "other"}).version != base
    assert Tool(**{**_fields(read_lines), "permission": Permission.WRITE}).version != base
    assert Tool(**{**_fields(read_lines), "source_hash": "changed"}).version != base
    assert Tool(**_fields(read_lines)).version == base


def _fields(t: Tool) -> dict[str, Any]:
    return {
        "name": t.name,
        "description": t.description,
        "parameters": t.parameters,
        "permission": t.permission,
        "fn_ref": t.fn_ref,
        "timeout_s": t.timeout_s,
        "source_hash": t.source_hash,
        "fn": t.fn,
    }


def test_invalid_schema_and_nested_functions_are_refused() -> None:
    with pytest.raises(Exception, match="type"):
        Tool(name="x", description="", parameters={"type": 5}, permission=Permission.READ, fn_ref="m:f")

    def make() -> None:
        @tool(Permission.READ)
        def inner(ctx: Any) -> str:
            return ""

    with pytest.raises(TypeError, match="module-level"):
        make()
    with pytest.raises(TypeError, match="unknown parameters"):
        tool(Permission.READ, params={"nope": "x"})(read_lines.fn)  # type: ignore[arg-type]


def test_env_config_follows_the_run_spec() -> None:
    from reprorl.config.spec import DataSpec, NoiseSpec
    from reprorl.envs import EnvConfig

    data = DataSpec(
        owner="o",
        train="t@v1",
        tool_output_chars=100,
        max_invalid_actions=2,
        noise=NoiseSpec(timeout_p=0.5),
        tool_permissions=("read", "network"),
    )
    config = EnvConfig.from_spec(data)
    assert config.allowed == frozenset({Permission.READ, Permission.NETWORK})
    assert (config.tool_output_chars, config.max_invalid_actions, config.noise.timeout_p) == (100, 2, 0.5)
    from reprorl.envs.families.calculator import CalculatorEnv

    assert CalculatorEnv.version(config) != CalculatorEnv.version(EnvConfig())
    assert CalculatorEnv.version(config) == CalculatorEnv.version(EnvConfig.from_spec(data))
