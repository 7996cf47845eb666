"""What a spec may hold before it is validated: how deep it nests, how large its numbers and texts are.

A TOML file or override is read into plain values first; anything beyond these limits is refused
there, in one line naming where, before a validator (or Python's own recursion and integer-conversion
limits) could fail on it. No spec field needs more than these.
"""

from __future__ import annotations

import tomllib
from typing import Any

from reprorl.errors import SpecError

MAX_DEPTH = 12  # tables and arrays inside each other: the deepest field is four levels down
MAX_INT_BITS = 64  # seeds and counts fit; a larger integer is a typo, not a setting
MAX_TEXT_CHARS = 65_536
MAX_ITEMS = 10_000

FieldPath = tuple[str | int, ...]


def dotted(path: FieldPath) -> str:
    """A field's path as a spec or an override writes it: `learning.loss.kind`, `evaluation.suites[0]`."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<spec>"


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """TOML text as plain values; every way it can fail is a `SpecError` naming `where`."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{where}: not valid TOML: {exc}") from None
    except RecursionError:
        raise SpecError(f"{where}: tables or arrays nest deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # Python's own limit on integer literals (4300 digits)
        raise SpecError(f"{where}: {integer_problem(str(exc))}") from None


def integer_problem(message: str) -> str:
    if "digits" in message:
        return f"an integer has thousands of digits; no spec field takes more than {MAX_INT_BITS} bits"
    return f"not valid TOML: {message}"


def check_limits(value: Any, path: FieldPath = ()) -> None:
    """Refuse the first place in `value` that nests too deep or holds too large a number, text or list.

    Walked with an explicit stack, so that a value nested past Python's recursion limit is refused
    like any other.
    """
    stack: list[tuple[Any, FieldPath]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        field = dotted(where) if where else None
        if len(where) > MAX_DEPTH:
            raise SpecError(f"nests deeper than {MAX_DEPTH} levels", field=field)
        if isinstance(item, bool):
            continue
        if isinstance(item, int) and item.bit_length() > MAX_INT_BITS:
            raise SpecError(
                f"is an integer of {item.bit_length()} bits; no spec field takes more than {MAX_INT_BITS}",
                field=field,
            )
        if isinstance(item, str) and len(item) > MAX_TEXT_CHARS:
            raise SpecError(f"is {len(item):,} characters long; at most {MAX_TEXT_CHARS:,}", field=field)
        if isinstance(item, dict | list) and len(item) > MAX_ITEMS:
            raise SpecError(f"holds {len(item):,} items; at most {MAX_ITEMS:,}", field=field)
        if isinstance(item, dict):
            stack.extend((v, (*where, str(k))) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, (*where, i)) for i, v in enumerate(item))
