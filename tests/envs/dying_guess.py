"""The guess env's server, dying on its Nth message (reset or step) once: a server killed mid-run.

`REPRORL_TEST_DIE_AT` is N; `REPRORL_TEST_DIE_MARKER` a file that says it died already, so the
server reprorl starts again lives.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from openenv.core.env_server.http_server import create_app

from reprorl.examples.openenv_guess import GuessAction, GuessEnvironment, GuessObservation

_seen = 0


def _maybe_die() -> None:
    global _seen
    _seen += 1
    marker = Path(os.environ["REPRORL_TEST_DIE_MARKER"])
    if _seen >= int(os.environ["REPRORL_TEST_DIE_AT"]) and not marker.exists():
        marker.write_text("died")
        os._exit(1)


class DyingGuess(GuessEnvironment):
    def reset(self, *args: Any, **kwargs: Any) -> GuessObservation:
        _maybe_die()
        return super().reset(*args, **kwargs)

    def step(self, *args: Any, **kwargs: Any) -> GuessObservation:
        _maybe_die()
        return super().step(*args, **kwargs)


app = create_app(DyingGuess, GuessAction, GuessObservation, env_name="dying-guess", max_concurrent_envs=64)
