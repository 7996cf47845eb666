"""Loading run specs from TOML with dotted overrides, and pinning their artifact references and precisions.

Every way a spec can be wrong ends in one `SpecError` whose message is a single line that names
the field (`learning.lr: ...`) and says how to fix it.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, Discriminator, TypeAdapter, ValidationError

from reprorl.config.judge import JudgeConfig, JudgeTable
from reprorl.config.limits import MAX_DEPTH, FieldPath, check_limits, dotted, integer_problem, parse_toml
from reprorl.config.model import PRECISION_FIELDS
from reprorl.config.spec import RunSpec
from reprorl.errors import FloatingReferenceError, SpecError, UserInputError
from reprorl.hardware import resolve_dtype
from reprorl.refs import ArtifactRef, RefError

MAX_SPEC_BYTES = 1 << 20
_MAX_PIN_ROUNDS = 4
_NO_VERSION = "has no version"


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split `a.b.c=value`; the value is read as a TOML value, or taken as a plain string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep:
        raise SpecError(f"override {text!r} has no '='; write KEY=VALUE, e.g. learning.lr=1e-5")
    parts = key.split(".")
    if not key or any(not p.strip() or p != p.strip() for p in parts):
        raise SpecError(f"override {text!r} has an empty or malformed key; write e.g. learning.lr=1e-5")
    raw = raw.strip()
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(f"override value is larger than {MAX_SPEC_BYTES} bytes", field=key)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        if any(c in raw for c in "[]{}\"'"):
            raise SpecError(f"{key}: override value {raw[:60]!r} is not valid TOML", field=None) from None
        value = raw  # bare words (names, refs) need no quotes on a command line
    except RecursionError:
        raise SpecError(f"override value nests deeper than {MAX_DEPTH} levels", field=key) from None
    except ValueError as exc:  # Python's own limit on integer literals
        raise SpecError(f"override value: {integer_problem(str(exc))}", field=key) from None
    if len(parts) > MAX_DEPTH:
        raise SpecError(f"names a field deeper than {MAX_DEPTH} levels", field=key)
    check_limits(value, tuple(parts))
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `a.b.c=value` override set."""
    out: dict[str, Any] = json.loads(json.dumps(data, default=str))
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise SpecError(f"is a value, not a table; cannot set {'.'.join(parts)}", field=where)
            node = child
        node[parts[-1]] = value
    return out


def read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise SpecError(f"spec file {str(path)!r} does not exist or is not a file")
    if path.stat().st_size > MAX_SPEC_BYTES:
        raise SpecError(f"spec file {str(path)!r} is larger than {MAX_SPEC_BYTES} bytes")
    try:
        text = path.read_text(encoding="utf-8-sig")  # editors on some systems add a BOM
    except UnicodeDecodeError:
        raise SpecError(f"spec file {str(path)!r} is not UTF-8 text") from None
    data = parse_toml(text, path.name)
    check_limits(data)
    return data


def _tagged_unions(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Paths of every field that is a tagged union, found by walking the spec models."""
    found: set[tuple[str, ...]] = set()
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        if info.discriminator is not None or any(isinstance(m, Discriminator) for m in info.metadata):
            found.add(path)
        for member in _model_args(info.annotation):
            found |= _tagged_unions(member, path)
    return found


def _model_args(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _model_args(arg)]


_TAGGED_UNIONS = frozenset(_tagged_unions(RunSpec))


def _field_path(loc: Sequence[str | int]) -> FieldPath:
    """The spec path of an error location, without the tag pydantic adds for a tagged union.

    Pydantic reports `model.adapter.lora.rank`; the spec (and an override) says `model.adapter.rank`.
    """
    out: list[str | int] = []
    skip = False
    for part in loc:
        if skip:
            skip = False
            continue
        out.append(part)
        skip = tuple(p for p in out if isinstance(p, str)) in _TAGGED_UNIONS
    return tuple(out)


def _describe(error: dict[str, Any]) -> tuple[str, str]:
    field = dotted(_field_path(tuple(error["loc"])))
    kind = error["type"]
    if kind == "extra_forbidden":
        return field, "unknown key; remove it or check its spelling (see docs/spec.md)"
    if kind == "missing":
        return field, "required but missing; add it"
    message = str(error["msg"])
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    given = error.get("input")
    if kind in ("string_pattern_mismatch", "string_too_short") and field.endswith("owner"):
        message = "must name who answers for it (a person or team, e.g. 'alice@example.com'): blank or "
        message += "invisible characters name nobody"
    elif kind == "greater_than" and field.startswith("budget.max_"):
        message += "; leave the field out for no cap"
    if kind not in ("value_error",) and not isinstance(given, dict | list):
        message += f" (got {json.dumps(given, default=str)[:60]})"
    return field, message


def spec_error_from(exc: ValidationError) -> SpecError:
    """Every problem, each one line naming its field and the fix; the first is the message."""
    errors = exc.errors()
    # A container's error that its own bad item caused (a list left too short once the item failed)
    # says nothing the item's line does not.
    locs = [tuple(e["loc"]) for e in errors]
    caused = {loc for loc in locs if any(o[: len(loc)] == loc != o for o in locs)}
    errors = [e for e, loc in zip(errors, locs, strict=True) if loc not in caused]
    described = [_describe(dict(e)) for e in errors]
    field, message = described[0]
    more = tuple(f"{f}: {m}" for f, m in described[1:])
    error_cls = FloatingReferenceError if "floating label" in message else SpecError
    return error_cls(message, field=field, more=more)


def _non_finite(value: Any, path: FieldPath = ()) -> FieldPath | None:
    """The path of the first NaN or infinity in `value`, if any."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if (found := _non_finite(item, (*path, key))) is not None:
            return found
    return None


def _to_json(data: dict[str, Any]) -> str:
    try:
        return json.dumps(data, default=str, allow_nan=False)
    except ValueError:
        where = _non_finite(data)
        raise SpecError(
            "is NaN or infinite; use a finite number", field=dotted(where) if where else None
        ) from None


def validate_spec(data: dict[str, Any]) -> RunSpec:
    """Validate a plain dict (as read from TOML) strictly: no silent type coercion."""
    try:
        return RunSpec.model_validate_json(_to_json(data), strict=True)
    except ValidationError as exc:
        raise spec_error_from(exc) from None


# Fields removed from the spec whose value in records of older versions (their default) never had
# an effect: such records still load. Any other value is refused, as an unknown key.
REMOVED_DEFAULTS: dict[tuple[str, str], Any] = {
    ("data", "envs"): [],
    ("evaluation", "metrics"): ["success", "invalid_tool_calls", "extra_steps", "tokens"],
}


# Loss fields older records hold flat in `learning`, beside `loss` as a name; each loss that reads
# one takes it into its table, and a loss that never read it drops it (it had no effect).
FLAT_LOSS_FIELDS: dict[str, tuple[str, ...]] = {
    "clip_low": ("ppo_clip", "ppo_ewma"),
    "clip_high": ("ppo_clip", "ppo_ewma"),
    "ewma_decay": ("ppo_ewma",),
}


def _loss_table(learning: dict[str, Any]) -> dict[str, Any]:
    """`learning` of an older record with `loss` as a table, the flat fields its loss read moved in."""
    if not isinstance(learning.get("loss", {}), str) and not any(k in learning for k in FLAT_LOSS_FIELDS):
        return learning
    out = dict(learning)
    table: Any = out.pop("loss", "ppo_clip")
    if isinstance(table, str):
        table = {"kind": table}
    for key, kinds in FLAT_LOSS_FIELDS.items():
        if key in out:
            value = out.pop(key)
            if isinstance(table, dict) and table.get("kind") in kinds:
                table[key] = value
    out["loss"] = table
    return out


# Pipeline settings older records hold flat in `learning`, and their names in `learning.pipeline`.
# `mode` is dropped: "sync" was max_staleness 0 on the same loop ("async" with 0 gave its results).
FLAT_PIPELINE_FIELDS = {
    "max_staleness": "max_staleness",
    "assembly": "source",
    "rollout_workers": "workers",
    "lockstep": "lockstep",
}


def _pipeline_table(learning: dict[str, Any]) -> dict[str, Any]:
    """`learning` of an older record with its pipeline settings moved into `learning.pipeline`."""
    if not any(k in learning for k in (*FLAT_PIPELINE_FIELDS, "mode")):
        return learning
    out = dict(learning)
    out.pop("mode", None)
    table = dict(out.get("pipeline") or {})
    for old, new in FLAT_PIPELINE_FIELDS.items():
        if old in out:
            table[new] = out.pop(old)
    if table.get("lockstep") == "arrival":
        table["lockstep"] = "ready"  # the lockstep's old name
    if table.get("source") == "arrival" and not table.get("max_staleness"):
        table["source"] = "planned"  # arrival order with no lag trained the planned groups
    out["pipeline"] = table
    return out


def stored_spec(doc: dict[str, Any]) -> RunSpec:
    """The run spec a record's `spec.json` holds, written by this version or an older one."""
    data = dict(doc)
    for (section, key), default in REMOVED_DEFAULTS.items():
        table = data.get(section)
        if isinstance(table, dict) and key in table and table[key] == default:
            data[section] = {k: v for k, v in table.items() if k != key}
    if isinstance(data.get("learning"), dict):
        data["learning"] = _pipeline_table(_loss_table(data["learning"]))
    return validate_spec(data)


def load_spec(
    path: str | Path, overrides: Sequence[str] = (), *, pin_bare: Callable[[str], str] | None = None
) -> RunSpec:
    """Read a TOML run spec, apply `a.b=value` overrides, and validate it.

    With `pin_bare`, a reference written as a bare name is replaced by what `pin_bare` returns
    (the newest registered hash) before validation; the result still stores only hashes.
    """
    data = apply_overrides(read_toml(Path(path)), overrides)
    if pin_bare is not None:
        data = _pin_bare_names(data, pin_bare)
    return validate_spec(data)


def _pin_bare_names(data: dict[str, Any], pin_bare: Callable[[str], str]) -> dict[str, Any]:
    for _ in range(_MAX_PIN_ROUNDS):
        try:
            RunSpec.model_validate_json(_to_json(data), strict=True)
            return data
        except ValidationError as exc:
            bare = [e for e in exc.errors() if _NO_VERSION in str(e["msg"])]
            if not bare:
                return data
            for error in bare:
                node: Any = data
                for part in error["loc"][:-1]:
                    node = node[part]
                try:
                    node[error["loc"][-1]] = pin_bare(str(error["input"]))
                except (KeyError, ValueError) as lookup:
                    message = lookup.args[0] if lookup.args else str(lookup)
                    raise SpecError(str(message), field=dotted(tuple(error["loc"]))) from None
    return data


def iter_refs(model: BaseModel, prefix: FieldPath = ()) -> Iterator[tuple[FieldPath, ArtifactRef]]:
    """Every artifact reference in a spec, with the path of the field that holds it."""
    for name in type(model).model_fields:
        yield from _walk(getattr(model, name), (*prefix, name))


def _walk(value: object, path: FieldPath) -> Iterator[tuple[FieldPath, ArtifactRef]]:
    if isinstance(value, ArtifactRef):
        yield path, value
    elif isinstance(value, BaseModel):
        yield from iter_refs(value, path)
    elif isinstance(value, tuple | list):
        for i, item in enumerate(value):
            yield from _walk(item, (*path, i))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, (*path, str(key)))


Resolver = Callable[[ArtifactRef], str]
"""Maps a reference to the full `name@sha256:<hex>` (or `sha256:<hex>`) it stands for."""


def resolve_spec(spec: RunSpec, resolver: Resolver) -> RunSpec:
    """Return the spec with every reference pinned to a full content hash and every "auto" precision
    to the one this machine computes fastest in (`reprorl.hardware.auto_dtype`)."""
    data = spec.model_dump(mode="json")
    for path, ref in iter_refs(spec):
        try:
            pinned = resolver(ref)
        except (RefError, KeyError, ValueError) as exc:
            message = exc.args[0] if exc.args else str(exc)
            raise SpecError(str(message), field=dotted(path)) from None
        node: Any = data
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = pinned
    for name in PRECISION_FIELDS:
        data["model"][name] = resolve_dtype(data["model"][name])
    return validate_spec(data)


def _unpinned(spec: RunSpec) -> Iterator[tuple[str, str]]:
    """Each field `resolve_spec` would still pin, with what it holds."""
    for path, ref in iter_refs(spec):
        if not ref.parsed.is_pinned:
            yield dotted(path), f"{ref!r} is not pinned to a content hash"
    for name in PRECISION_FIELDS:
        if getattr(spec.model, name) == "auto":
            yield f"model.{name}", "'auto' is not pinned to a precision"


def is_resolved(spec: RunSpec) -> bool:
    return next(_unpinned(spec), None) is None


def ensure_resolved(spec: RunSpec) -> RunSpec:
    """Raise naming the first field not pinned (a reference to a full hash, a precision from "auto")."""
    for field, problem in _unpinned(spec):
        raise SpecError(f"{problem}; resolve the spec against a registry first", field=field)
    return spec


def load_judge_config(path: Path) -> JudgeConfig:
    """A TOML file of `JudgeConfig` fields (`--judge FILE`); any problem is one line naming the field."""
    where = f"--judge {path.name}"
    if not path.is_file():
        raise UserInputError(f"{str(path)!r} does not exist or is not a file", field="--judge")
    if path.stat().st_size > MAX_SPEC_BYTES:
        raise UserInputError(f"larger than {MAX_SPEC_BYTES} bytes", field=where)
    try:
        data = parse_toml(path.read_text(encoding="utf-8-sig"), where)
        check_limits(data)
    except UnicodeDecodeError:
        raise UserInputError("is not UTF-8 text", field=where) from None
    if "override" in data:
        raise UserInputError(
            "`override` belongs in a run spec's data.judge, where it lets a run train on an unaudited "
            "judge; remove it from this file",
            field=f"{where}: override",
        )
    try:
        config: JudgeConfig = TypeAdapter(JudgeTable).validate_python(data)
    except ValidationError as exc:
        raise UserInputError(str(spec_error_from(exc)), field=where) from None
    return config
