"""A verifier worker: a clean interpreter that scores one final state at a time, sent to it over a pipe.

Run as `python -m reprorl.rewards.worker`. It is a fresh interpreter, never a fork or a re-import of
the launching script, so a script without an `if __name__ == "__main__":` guard runs once. It dies
with its parent (`PR_SET_PDEATHSIG`), even while a verifier in it hangs, so a killed run leaves no
worker behind. Messages are length-prefixed pickles: the parent sends `(verifier, task, state)`
(cloudpickled, so a verifier class defined in a script travels by value); the worker answers `LOADED`
once it has unpickled them, which starts the call's time limit, then `(kind, payload)`.
"""

from __future__ import annotations

import ctypes
import math
import os
import pickle
import signal
import sys
from typing import Any

from reprorl.rewards.wire import LOADED, receive, send

PR_SET_PDEATHSIG = 1


def score_one(verifier: Any, task: Any, state: Any) -> tuple[str, Any]:
    """`("ok", components)`, `("agent", why)` for a state the agent broke, or `("error", why)`."""
    from reprorl.rewards.base import StateAccessError

    try:
        components = verifier.score(task, state)
        clean: dict[str, float] = {}
        for name, value in components.items():
            number = float(value)
            if not math.isfinite(number):
                raise ValueError(f"component {name!r} is {number}")
            clean[str(name)] = number
    except StateAccessError as exc:  # the agent's planted state, told apart from the verifier's bugs
        return "agent", str(exc)[:300]
    except Exception as exc:
        return "error", f"{type(exc).__name__}: {str(exc)[:300]}"
    return "ok", clean


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(0)


def main() -> None:
    parent = int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid()
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the run's to handle, not each worker's
    inbox, outbox = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a verifier's print() must not corrupt the channel
    setup = receive(inbox)
    if setup is None:
        return
    for entry in pickle.loads(setup):
        if entry not in sys.path:
            sys.path.append(entry)
    while (request := receive(inbox)) is not None:
        try:
            verifier, task, state = pickle.loads(request)
        except Exception as exc:
            send(outbox, LOADED)
            reply: tuple[str, Any] = ("error", f"could not load: {type(exc).__name__}: {str(exc)[:300]}")
        else:
            send(outbox, LOADED)
            reply = score_one(verifier, task, state)
        send(outbox, pickle.dumps(reply))


if __name__ == "__main__":
    main()
