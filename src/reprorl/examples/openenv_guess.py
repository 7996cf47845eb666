"""An OpenEnv environment written with `openenv-core`'s own server classes: guess a secret number.

It is the example behind docs/openenv.md and the adapter's tests, and an OpenEnv server like any
other: `reset(seed)` draws a secret from 1 to `high` with that seed, each `step` takes a guess and
answers `higher`, `lower` or `correct`; a correct guess ends the episode with reward 1, and each
episode allows `max_guesses` guesses (then it ends with reward 0). Serve it with

    python -m uvicorn reprorl.examples.openenv_guess:app --host 127.0.0.1 --port 8000

`FAMILY` is the reprorl family over it (`openenv-guess`), for `register_family` or a package's
`reprorl.families` entry point: reprorl starts this server itself on a free port of 127.0.0.1.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Sequence
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

HIGH = 100
MAX_GUESSES = 8
SERVE_ON = ("--host", "127.0.0.1", "--port", "{port}")  # reprorl puts the port it picked in


class GuessAction(Action):
    """One guess."""

    guess: int = Field(..., ge=1, le=HIGH, description=f"Your guess, from 1 to {HIGH}.")


class GuessObservation(Observation):
    """What the env says of the last guess."""

    hint: str = Field(default="", description="'higher', 'lower' or 'correct' ('' after reset).")
    guesses_left: int = Field(default=MAX_GUESSES, ge=0)


class GuessEnvironment(Environment):
    """Each WebSocket session gets its own instance, so concurrent episodes never share a secret."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._secret = 0
        self._left = MAX_GUESSES
        self._state = State(episode_id=None, step_count=0)

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        unsolvable: bool = False,
        **kwargs: Any,
    ) -> GuessObservation:
        # `unsolvable`: a secret outside the guesses' range, the reward audit's impossible variant.
        self._secret = HIGH + 1 if unsolvable else random.Random(seed).randint(1, HIGH)
        self._left = MAX_GUESSES
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(hint="", guesses_left=self._left, done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        self._left -= 1
        if action.guess == self._secret:
            return GuessObservation(hint="correct", guesses_left=self._left, done=True, reward=1.0)
        hint = "higher" if action.guess < self._secret else "lower"
        return GuessObservation(hint=hint, guesses_left=self._left, done=self._left <= 0, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=64)


def oracle(task: Any, messages: Sequence[Any]) -> str:
    """Binary search on the env's hints: every guess halves what is left."""
    from reprorl.actions import parse_action, render_call

    low, high, last = 1, HIGH, None
    for message in messages:
        role = getattr(message, "role", None)
        if role == "assistant":
            calls = parse_action(message.content).tool_calls
            last = int(str(calls[0].arguments["guess"])) if calls else None
        elif role == "tool" and last is not None:
            hint = json.loads(message.content).get("hint", "")
            if hint == "correct":
                return f"The number is {last}."
            low, high = (last + 1, high) if hint == "higher" else (low, last - 1)
    return render_call("guess", {"guess": (low + high) // 2})


def unsolvable(task: Any) -> Any:
    """The task with a secret no guess can hit."""
    setup = dict(task.setup or {})
    return task.model_copy(update={"id": f"{task.id}-impossible", "setup": {**setup, "unsolvable": True}})


def _family() -> Any:
    from reprorl.rollout.external_families import OpenEnvServerSpec, openenv_family

    server = OpenEnvServerSpec(
        command=(*(sys.executable, "-m", "uvicorn", f"{__name__}:app"), *SERVE_ON),
        package="reprorl",
        name="guess",
    )
    return openenv_family(
        "openenv-guess",
        server,
        tool="guess",
        instruction=f"Find the secret number from 1 to {HIGH} with the guess tool, then say it.",
        oracle=oracle,
        impossible=unsolvable,
    )


FAMILY = _family()
