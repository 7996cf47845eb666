"""Registries of named parts (env families, losses, verifiers, judges), filled by decorators and entry points.

A part is registered where it is defined (`@register_loss`, `register_family(...)`), so adding one
never means editing a central table. An installed package adds its own through an entry-point group
(`reprorl.families`, `reprorl.losses`, ...): the entry point's name is the part's name and its value
the object (or a module whose import registers it). Entry points load lazily — on the first lookup of
a name this process has not registered, or when every name is asked for — so a run that uses only the
built-ins never imports a plug-in. The built-ins' own modules are named here as strings and imported
on first use, which keeps the registry below the layers whose parts it holds.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

from reprorl.errors import UserInputError

T = TypeVar("T")


@dataclass(frozen=True)
class Origin:
    """Where a registered part came from: a module of reprorl, or an installed distribution."""

    module: str
    distribution: str | None = None  # "name version" of the package whose entry point added it
    entry_point: str | None = None


class Registry(Mapping[str, T], Generic[T]):
    """Name -> part, for one kind of part; a `Mapping`, so it can stand wherever a table did."""

    def __init__(
        self,
        what: str,
        group: str,
        *,
        builtins: tuple[str, ...] = (),
        accept: Callable[[str, object], T | None] | None = None,
        plural: str | None = None,
    ) -> None:
        """`what` names the kind in messages ("env family"); `group` is the entry-point group;
        `builtins` are modules whose import registers the built-in parts; `accept` turns what an
        entry point loads into a part (None when the load registered it itself)."""
        self.what, self.group, self.builtins = what, group, builtins
        self.plural = plural or f"{what}s"
        self._accept = accept
        self._parts: dict[str, T] = {}
        self._origins: dict[str, Origin] = {}
        self._lock = threading.RLock()
        self._builtins_loaded = False
        self._scanned = False

    # -- registering ---------------------------------------------------------------------------

    def add(self, name: str, part: T, *, module: str | None = None) -> T:
        """Register `part` as `name`; the same part twice is fine, another one under a taken name is not."""
        with self._lock:
            held = self._parts.get(name)
            if held is not None and held is not part and _identity(held) != _identity(part):
                where = self._origins[name].module
                raise ValueError(f"{self.what} {name!r} is already registered (by {where})")
            self._parts[name] = part
            self._origins.setdefault(name, Origin(module or _module_of(part)))
        return part

    @contextlib.contextmanager
    def override(self, name: str, part: T) -> Iterator[T]:
        """`name` stands for `part` inside the block (a test's planted variant), as before after it."""
        if name in self.names():
            _ = self[name]  # load what it replaces, so that it comes back after the block
        with self._lock:
            held, origin = self._parts.get(name), self._origins.get(name)
            self._parts[name], self._origins[name] = part, Origin(_module_of(part))
        try:
            yield part
        finally:
            with self._lock:
                if held is None or origin is None:
                    self._parts.pop(name, None)
                    self._origins.pop(name, None)
                else:
                    self._parts[name], self._origins[name] = held, origin

    def remove(self, name: str) -> None:
        """Forget `name` (an uninstalled plug-in); its entry point, if still installed, loads again."""
        with self._lock:
            self._parts.pop(name, None)
            self._origins.pop(name, None)

    # -- looking up ----------------------------------------------------------------------------

    def __getitem__(self, name: str) -> T:
        self._load_builtins()
        with self._lock:
            if name in self._parts:
                return self._parts[name]
        for point in self._points():
            if point.name == name:
                self._load(point)
        with self._lock:
            if name in self._parts:
                return self._parts[name]
        raise KeyError(f"no {self.what} {name!r}; {self.plural}: {', '.join(self.names()) or 'none'}")

    def get_part(self, name: str, field: str) -> T:
        """`self[name]`, or one line naming the spec field when there is no such part."""
        try:
            return self[name]
        except KeyError as exc:
            raise UserInputError(str(exc.args[0]), field=field) from None

    def names(self) -> list[str]:
        """Every name: registered, built in, and offered by an installed package (not loaded)."""
        self._load_builtins()
        with self._lock:
            known = set(self._parts)
        return sorted(known | {p.name for p in self._points()})

    def load_all(self) -> dict[str, T]:
        """Every part, entry points loaded; a package whose entry point fails is named."""
        self._load_builtins()
        for point in self._points():
            if point.name not in self._parts:
                self._load(point)
        with self._lock:
            return dict(self._parts)

    def origin(self, name: str) -> Origin:
        self[name]
        return self._origins[name]

    def builtin_names(self) -> list[str]:
        """The names reprorl itself registers (what its reference docs describe)."""
        self._load_builtins()
        return sorted(n for n, o in self._origins.items() if o.module.startswith("reprorl."))

    def __iter__(self) -> Iterator[str]:
        return iter(self.load_all())

    def __len__(self) -> int:
        return len(self.load_all())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    # -- loading -------------------------------------------------------------------------------

    def _load_builtins(self) -> None:
        if self._builtins_loaded:
            return
        with self._lock:
            if self._builtins_loaded:
                return
            self._builtins_loaded = True
            for module in self.builtins:
                importlib.import_module(module)

    def _points(self) -> list[EntryPoint]:
        return list(entry_points(group=self.group))

    def _load(self, point: EntryPoint) -> None:
        dist = f"{point.dist.name} {point.dist.version}" if point.dist is not None else None
        try:
            loaded: Any = point.load()
        except Exception as exc:
            raise UserInputError(
                f"entry point {point.name!r} of {dist or 'an installed package'} in group {self.group} "
                f"failed to load ({type(exc).__name__}: {exc}); fix or uninstall that package",
                field=self.group,
            ) from exc
        part = self._accept(point.name, loaded) if self._accept is not None else None
        with self._lock:
            if part is not None:
                self.add(point.name, part, module=point.value)
            if point.name not in self._parts:
                raise UserInputError(
                    f"entry point {point.name!r} of {dist or 'an installed package'} ({point.value}) "
                    f"registers no {self.what} named {point.name!r}; its name must be the "
                    f"{self.what}'s name",
                    field=self.group,
                )
            origin = self._origins[point.name]
            if origin.distribution is None:
                self._origins[point.name] = Origin(origin.module, dist, f"{self.group}:{point.name}")


def _module_of(part: object) -> str:
    return str(getattr(part, "__module__", None) or type(part).__module__)


def _identity(part: object) -> tuple[str, str]:
    # A module imported twice (as a script and by name) makes an equal part that is another object.
    identity = getattr(part, "identity", None)
    if isinstance(identity, tuple):
        return identity
    return _module_of(part), str(getattr(part, "__qualname__", getattr(part, "name", repr(part))))
