"""Admission per model: the places a model's requests hold (its `contexts` answering, `max_queue` waiting),
and the turns a batch's items take so that they never stand between a single request and a context.

A single request takes one place when it comes (503 when there is none) and runs at once; its worker
gives the place back when the work has really stopped, not when the client stopped waiting. A batch
answered in its response takes one place per request at the door, all or none; a batch job takes its
place as each of its requests runs. Either way a batch's next request starts only when one of the
model's contexts has nothing running (for a model that batches requests: fewer than a few per context,
which then share its decodes): a single request waits for at most the batch requests already
running when it came, never for a whole batch. Fitting and labelling take no places: the engine lends
its contexts to them only when no request waits (app/engine/caller.py), so a request waits for at most
the step of theirs already running, never for a whole fit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from app.engine.caller import Signal
from app.errors import ApiError


def overloaded(message: str) -> ApiError:
    return ApiError(503, "overloaded", message, {"Retry-After": "1"})


class Admission:
    """Counts per model, changed under one lock by the event loop and the batches' worker threads."""

    def __init__(self) -> None:
        self.changed = threading.Condition()  # notified whenever a count changes
        self._held: dict[str, int] = {}  # places: requests admitted and not yet answered
        self._running: dict[str, int] = {}  # single requests admitted, batch requests started
        self._waiting: dict[str, int] = {}  # batch requests waiting for their turn

    def held(self, name: str) -> int:
        with self.changed:
            return self._held.get(name, 0)

    def waiting(self, name: str) -> int:
        with self.changed:
            return self._waiting.get(name, 0)

    def _add(self, counts: dict[str, int], name: str, delta: int) -> None:
        counts[name] = counts.get(name, 0) + delta
        self.changed.notify_all()

    def take(self, name: str, capacity: int) -> Place:
        """A single request's place among the `capacity` its model has (503 when there is none), held
        until its worker gives it back (Place)."""
        with self.changed:
            held = self._held.get(name, 0)
            if held >= capacity:
                raise overloaded(f"{held} requests in flight for {name}; try again shortly")
            self._add(self._held, name, 1)
            self._add(self._running, name, 1)
        return Place(self, name)

    def _leave(self, name: str) -> None:
        with self.changed:
            self._add(self._held, name, -1)
            self._add(self._running, name, -1)

    def reserve(self, wanted: Mapping[str, int], capacity: Mapping[str, int]) -> None:
        """A place for each of a batch's requests, per model, all or none (503 when a model lacks room)."""
        with self.changed:
            for name, count in wanted.items():
                held = self._held.get(name, 0)
                if held + count > capacity[name]:
                    raise overloaded(
                        f"{held} requests in flight for {name}; a batch of {count} more does not fit; try again shortly"
                    )
            for name, count in wanted.items():
                self._add(self._held, name, count)

    def release(self, name: str, count: int) -> None:
        """Give back places reserved for requests that will not run."""
        with self.changed:
            self._add(self._held, name, -count)

    def turn(self, name: str, contexts: int, capacity: int | None, stop: Signal, deadline: float) -> bool:
        """Wait until fewer than `contexts` requests of the model run, then run: True. False when `stop`
        is set or `deadline` (time.monotonic()) passes first. With `capacity` (a job's request, which
        reserved nothing) the place is taken now, once there is one."""
        with self.changed:
            self._add(self._waiting, name, 1)
            try:
                ready = self.changed.wait_for(
                    lambda: (
                        stop.is_set()
                        or (
                            self._running.get(name, 0) < contexts
                            and (capacity is None or self._held.get(name, 0) < capacity)
                        )
                    ),
                    timeout=max(0.0, deadline - time.monotonic()),
                )
            finally:
                self._add(self._waiting, name, -1)
            if not ready or stop.is_set():
                return False
            self._add(self._running, name, 1)
            if capacity is not None:
                self._add(self._held, name, 1)
            return True

    def done(self, name: str) -> None:
        """A batch's request that had its turn is answered: its place and its run end."""
        with self.changed:
            self._add(self._running, name, -1)
            self._add(self._held, name, -1)

    def stop(self, event: Signal) -> None:
        """Set a batch's stop event and wake its turn if it waits for one."""
        event.set()
        with self.changed:
            self.changed.notify_all()


class Place:
    """A single request's place, given back exactly once: by the worker that answers the request when
    its work ends, or by the event loop when that worker never started (the client left first)."""

    def __init__(self, admission: Admission, name: str) -> None:
        self._admission, self._name = admission, name
        self._lock = threading.Lock()
        self._claimed = self._given_back = False

    def claim(self) -> bool:
        """The worker, as it starts: True when the request is still to be answered (the place is then
        its to give back), False when the loop gave the place back already."""
        with self._lock:
            self._claimed = not self._given_back
            return self._claimed

    def give_back(self) -> None:
        """The worker, as its work ends."""
        with self._lock:
            if self._given_back:
                return
            self._given_back = True
        self._admission._leave(self._name)

    def give_back_unclaimed(self) -> None:
        """The loop, once it stops waiting: gives the place back only if no worker claimed it."""
        with self._lock:
            if self._claimed or self._given_back:
                return
            self._given_back = True
        self._admission._leave(self._name)
