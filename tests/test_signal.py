"""A Signal wakes whoever waits on something else meanwhile: a waiter for a context, another request's
prefill or a model's load leaves its wait when its caller's stop is set, looking at nothing from time to
time (app/engine/caller.py)."""

from __future__ import annotations

import threading

from app.engine.caller import Signal, wait_either

WAIT_S = 30  # every wait here is bounded; a healthy run takes milliseconds


def test_waking_calls_back_on_set_at_once_when_set_already_and_never_after_leaving() -> None:
    signal, calls = Signal(), []
    with signal.waking(lambda: calls.append("inside")):
        assert calls == []
        signal.set()
        assert calls == ["inside"]
    signal.clear()
    signal.set()  # left: no call
    assert calls == ["inside"]
    with signal.waking(lambda: calls.append("set already")):
        pass
    assert calls == ["inside", "set already"]


def waiter_on(first: Signal, second: Signal) -> tuple[threading.Thread, threading.Event]:
    """A thread in wait_either on the two, and what it sets once it returns."""
    returned = threading.Event()

    def wait() -> None:
        wait_either(first, second)
        returned.set()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread, returned


def test_wait_either_returns_when_either_is_set() -> None:
    for which in (0, 1):
        signals = (Signal(), Signal())
        thread, returned = waiter_on(*signals)
        assert not returned.is_set()
        signals[which].set()
        assert returned.wait(WAIT_S)
        thread.join(WAIT_S)
