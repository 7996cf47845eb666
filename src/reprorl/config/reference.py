"""The run-spec reference, rendered from the field descriptions so the docs cannot drift."""

from __future__ import annotations

import inspect
import json
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from reprorl.config.spec import RunSpec

BEGIN = "<!-- BEGIN GENERATED: reprorl.config.reference -->"
END = "<!-- END GENERATED -->"


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        # A table chosen by `kind` from a registry: its built-in variants, each a section.
        variants = getattr(annotation, "variants", None)
        return list(variants()) if callable(variants) else [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found.extend(_models(arg))
    return found


def _type_name(annotation: Any) -> str:
    variants = getattr(annotation, "variants", None) if isinstance(annotation, type) else None
    if callable(variants):
        return f"table by kind: {' | '.join(v.__name__ for v in variants())}"
    if isinstance(annotation, type):
        return "artifact ref" if annotation.__name__ == "ArtifactRef" else annotation.__name__
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (types.UnionType, typing.Union):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is tuple:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"table of {_type_name(args[1])}"
    return str(annotation)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        return "see below" if isinstance(value, BaseModel) else f"`{_show(value)}`"
    return "" if field.default is PydanticUndefined else f"`{_show(field.default)}`"


def _show(value: Any) -> str:
    return json.dumps(list(value) if isinstance(value, tuple) else value)


def _section(model: type[BaseModel], path: str, out: list[str], seen: set[str]) -> None:
    out += [
        f"### `{path or '(top level)'}` — {model.__name__}",
        "",
        inspect.cleandoc(model.__doc__ or ""),
        "",
    ]
    out += ["| key | type | default | meaning |", "|---|---|---|---|"]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        subs = _models(field.annotation)
        meaning = field.description or ("table; see below" if subs else "")
        if name == "kind" and not meaning:
            meaning = "Selects this variant."
        kind = _type_name(field.annotation).replace("NoneType", "none")
        out.append(f"| `{name}` | {_cell(kind)} | {_cell(_default(field))} | {_cell(meaning)} |")
        for sub in subs:
            nested.append((f"{path}.{name}" if path else name, sub))
    out.append("")
    for sub_path, sub in nested:
        key = f"{sub_path}:{sub.__name__}"
        if key not in seen:
            seen.add(key)
            _section(sub, sub_path, out, seen)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_reference() -> str:
    """Markdown tables of every spec section and field, from the models themselves."""
    out: list[str] = []
    _section(RunSpec, "", out, set())
    return "\n".join(out).rstrip() + "\n"


def update_file(path: Path) -> bool:
    """Rewrite the generated section of `path`; True when it changed."""
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n\n{render_reference()}\n{END}{tail}"
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    import sys

    for name in sys.argv[1:]:
        print(f"{name}: {'updated' if update_file(Path(name)) else 'current'}")
