"""Whom the engine works for at a moment, its caller: the lane the caller's next step takes a context
in, and whether anyone still waits for the answer.

A request's inference is several steps on the pool (a prefill, a decode of its questions, the
content-free priors of a new question), each of which borrows a context. Rather than thread the
lane and the stop event through every signature between the route and the pool, the code that
starts a piece of work names its caller once (`working_for`), in its worker thread, and every step
below reads it (`current`). A context variable belongs to its thread, so concurrent requests never
see each other's.

Lanes: interactive callers (single requests, batch items) are always lent an idle context first.
Background callers (fitting and labelling answering their examples) take a context only when no
interactive caller waits for one, and hold at most about half of the model's contexts, so a
request waits for at most one background step already running, never for a whole fit.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal

from app.errors import Cancelled

# How often a step waiting for another (a context, another request's prefill or decode) looks whether
# its caller was stopped meanwhile: the stop event belongs to the request, not to what it waits on, so
# it cannot wake the waiter itself.
STOP_POLL_S = 0.05

Lane = Literal["interactive", "background"]
LANES: tuple[Lane, ...] = ("interactive", "background")


@dataclass(frozen=True)
class Caller:
    """A caller's lane and its stop event (set: nobody waits for its answer any more)."""

    lane: Lane = "interactive"
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def stopped(self) -> bool:
        return self.stop.is_set()

    def check(self, step: str) -> None:
        """Raise Cancelled before `step` once nobody waits for the answer."""
        if self.stop.is_set():
            raise Cancelled(f"cancelled before {step}")


_NOBODY_STOPS = Caller()  # what runs outside working_for (tools, tests, the model's own load) is interactive
_current: ContextVar[Caller] = ContextVar("onepass_caller", default=_NOBODY_STOPS)


def current() -> Caller:
    """The caller this thread works for now."""
    return _current.get()


@contextlib.contextmanager
def working_for(caller: Caller) -> Iterator[Caller]:
    """Run the engine steps inside for `caller`."""
    token = _current.set(caller)
    try:
        yield caller
    finally:
        _current.reset(token)
