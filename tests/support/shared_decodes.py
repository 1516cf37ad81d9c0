"""Making requests wait for one shared decode (app/engine/shared_decode.py): the engine's one context
lent to another thread while they come, and how many wait."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from app.engine.engine import Engine


def queued(engine: Engine) -> int:
    """Requests waiting for a shared decode and not yet taken."""
    assert engine._shared is not None
    return engine._pool.questions_waiting()


@contextlib.contextmanager
def context_lent(engine: Engine, wait_s: float) -> Iterator[None]:
    """The engine's one context lent to another thread inside: requests queue up meanwhile, and the first
    of them to get the context as it comes back leads them all."""
    got, go = threading.Event(), threading.Event()

    def hold() -> None:
        with engine._pool.borrow(None):
            got.set()
            assert go.wait(wait_s)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert got.wait(wait_s)
    try:
        yield
    finally:
        go.set()
        holder.join(wait_s)
