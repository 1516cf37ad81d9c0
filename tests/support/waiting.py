"""Waiting, within a bound, for other threads to reach a state the code under test counts."""

from __future__ import annotations

import threading
from collections.abc import Callable


def until(condition: Callable[[], bool], wait_s: float) -> None:
    """Return once `condition()` holds; fail the test if it does not within `wait_s`."""
    tick = threading.Event()
    for _ in range(int(wait_s / 0.01)):
        if condition():
            return
        tick.wait(0.01)
    raise AssertionError("the other threads never got there")
