"""Options shared by every command (store root, database URL, debug) and the store they open."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from reprorl.store import Store


@dataclass
class Options:
    home: Path | None = None
    db_url: str | None = None
    debug: bool = False

    def store(self) -> Store:
        return Store(self.home, self.db_url)


def options(ctx: typer.Context) -> Options:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, Options) else Options()
