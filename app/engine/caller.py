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
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Literal

from app.errors import Cancelled

Lane = Literal["interactive", "background"]
LANES: tuple[Lane, ...] = ("interactive", "background")


class Signal(threading.Event):
    """An event that, when set, also wakes whoever waits on something else meanwhile (`waking`): a step
    waiting for a context, for another request's prefill or for a model to load leaves its wait the
    moment its caller's stop is set, without looking at it from time to time."""

    def __init__(self) -> None:
        super().__init__()
        self._wakers: dict[object, Callable[[], None]] = {}
        self._wakers_lock = threading.Lock()

    def set(self) -> None:
        super().set()
        with self._wakers_lock:
            wakers = list(self._wakers.values())
        for wake in wakers:
            wake()

    @contextlib.contextmanager
    def waking(self, wake: Callable[[], None]) -> Iterator[None]:
        """Call `wake` when the signal is set while inside (at once if it is set already)."""
        key = object()
        with self._wakers_lock:
            self._wakers[key] = wake
        try:
            if self.is_set():
                wake()
            yield
        finally:
            with self._wakers_lock:
                del self._wakers[key]


def wait_either(first: Signal, second: Signal) -> None:
    """Wait until `first` or `second` is set."""
    woken = threading.Event()
    with first.waking(woken.set), second.waking(woken.set):
        woken.wait()


class Caller:
    """A caller's lane and its stop (set: nobody waits for its answer any more).

    A caller may be promoted (`promote`): its lane is interactive from then on. A background prefill
    that an interactive request waits for (the RAM tier's single flight) is promoted, so that the
    request waits behind no other background work through it."""

    def __init__(self, lane: Lane = "interactive", stop: Signal | None = None) -> None:
        self._lane: Lane = lane
        self.stop = stop if stop is not None else Signal()
        self.promoted = Signal()

    @property
    def lane(self) -> Lane:
        return "interactive" if self.promoted.is_set() else self._lane

    @property
    def stopped(self) -> bool:
        return self.stop.is_set()

    def check(self, step: str) -> None:
        """Raise Cancelled before `step` once nobody waits for the answer."""
        if self.stop.is_set():
            raise Cancelled(f"cancelled before {step}")

    def promote(self) -> None:
        """Interactive from now on: an interactive request waits for this caller's work."""
        self.promoted.set()

    def on_behalf(self) -> Caller:
        """A caller for one piece of work done on this one's behalf (a prefill others may wait for): its
        lane and its stop now, promoted on its own."""
        return Caller(self.lane, self.stop)


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
