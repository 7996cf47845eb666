"""Tools: a name, an OpenAI function schema, a permission scope, and code, with a version hash.

A tool's version is the hash of everything that defines its behaviour as the model sees it
(name, description, schema, permission, time limit) and of its implementation's source, so a
changed tool can never hide behind an unchanged name. Arguments are validated against the schema
before anything runs. Sandbox tools are module-level functions `fn(ctx, **arguments) -> str`
executed inside the episode's sandbox; host tools (e.g. `ask_human`) run in the orchestrator.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from pydantic import Field, create_model

from reprorl.hashing import code_fingerprint, content_hash
from reprorl.types import Permission

if typing.TYPE_CHECKING:
    from reprorl.envs.mcp_remote import MCPRemote

ToolFunction = Callable[..., str]
JsonSchema = dict[str, Any]


@dataclass(frozen=True)
class Tool:
    """A callable capability offered to the agent."""

    name: str
    description: str
    parameters: JsonSchema
    permission: Permission
    fn_ref: str
    """`package.module:function`, importable inside the sandbox."""
    timeout_s: float = 10.0
    host: bool = False
    """Runs in the orchestrator instead of the sandbox (only for tools that touch no state)."""
    source_hash: str = ""
    bound: Mapping[str, Any] | None = field(default=None, compare=False)
    """Fixed arguments of `fn_ref` (an MCP tool's server and name): the sandbox calls it with these
    and the agent's arguments as `arguments`, instead of with the agent's arguments alone."""
    remote: MCPRemote | None = None
    """A host tool an MCP server serves at a URL: where the env sends its calls."""
    fn: ToolFunction | None = field(default=None, repr=False, compare=False)
    _validator: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        jsonschema.Draft202012Validator.check_schema(self.parameters)
        object.__setattr__(self, "_validator", jsonschema.Draft202012Validator(self.parameters))

    @functools.cached_property
    def version(self) -> str:
        described: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "permission": self.permission.value,
            "timeout_s": self.timeout_s,
            "host": self.host,
            "source": self.source_hash,
        }
        if self.bound is not None:  # absent otherwise, so other tools keep their versions
            described["bound"] = dict(self.bound)
        return content_hash(described)

    def call_args(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """What the sandbox calls `fn_ref` with for the agent's `arguments`."""
        return arguments if self.bound is None else {**self.bound, "arguments": arguments}

    def openai_schema(self) -> JsonSchema:
        """The tool as an OpenAI `tools` entry."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def argument_error(self, arguments: dict[str, Any]) -> str | None:
        """Why `arguments` do not fit the schema (first problem only), or None when they do."""
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(arguments))
        if error is None:
            return None
        where = ".".join(str(p) for p in error.absolute_path)
        return f"{where}: {error.message}" if where else error.message

    def __call__(self, ctx: Any, /, **arguments: Any) -> str:
        """Run the implementation; `fn_ref` names this object, so the sandbox can call it directly."""
        if self.fn is None:
            raise TypeError(f"tool {self.name} has no implementation in this process")
        return self.fn(ctx, **arguments)


def _schema_from_signature(fn: ToolFunction, params: dict[str, str]) -> JsonSchema:
    signature = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    fields: dict[str, Any] = {}
    for name in list(signature.parameters)[1:]:  # the first parameter is the tool context
        parameter = signature.parameters[name]
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        fields[name] = (hints.get(name, str), Field(default, description=params.get(name)))
    unknown = set(params) - set(fields)
    if unknown:
        raise TypeError(f"{fn.__name__}: descriptions for unknown parameters {sorted(unknown)}")
    model = create_model(f"{fn.__name__}_args", **fields)
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema["additionalProperties"] = False
    return schema


def tool(
    permission: Permission,
    *,
    params: dict[str, str] | None = None,
    name: str | None = None,
    timeout_s: float = 10.0,
    host: bool = False,
) -> Callable[[ToolFunction], Tool]:
    """Declare a tool from a module-level function; its schema comes from the signature.

    The docstring's first paragraph is the description the model sees; `params` describes each
    argument. The function's first parameter receives the tool context. The decorated name becomes
    the `Tool`, which is itself callable, so `module:name` works as the sandbox's function reference.
    """

    def wrap(fn: ToolFunction) -> Tool:
        if fn.__qualname__ != fn.__name__:
            raise TypeError(f"{fn.__qualname__}: tools must be module-level functions")
        doc = inspect.getdoc(fn) or ""
        return Tool(
            name=name or fn.__name__,
            description=doc.split("\n\n")[0].replace("\n", " ").strip(),
            parameters=_schema_from_signature(fn, params or {}),
            permission=permission,
            fn_ref=f"{fn.__module__}:{fn.__name__}",
            timeout_s=timeout_s,
            host=host,
            source_hash=code_fingerprint(fn),
            fn=fn,
        )

    return wrap
