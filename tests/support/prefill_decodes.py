"""llama_decode watched on a prefill's thread: a hook as each of its decodes starts and once it has
returned, and the status and size of each, for tests that make requests come at a given moment of a
prefill; and one such request, come and gone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from app.engine import bindings
from app.engine.engine import Engine
from app.engine.snapshot import Prefix, Snapshot
from tests.support.borrowers import WAIT_S, Borrower
from tests.support.waiting import until


class Decodes:
    """llama_decode as the engine calls it, with `before(call)` and `after(call)` run on the prefill's
    thread as each of the prefill's decodes starts and once it has returned (`call` counts from 1), and
    every status recorded."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        before: Callable[[int], None] = lambda call: None,
        after: Callable[[int], None] = lambda call: None,
    ) -> None:
        bindings.init()
        import llama_cpp

        self.statuses: list[int] = []
        self.sizes: list[int] = []  # the tokens of each
        self.prefill_thread: threading.Thread | None = None
        decode = llama_cpp.llama_decode

        def watched(ctx: Any, batch: Any) -> Any:
            if threading.current_thread() is not self.prefill_thread:
                return decode(ctx, batch)
            call = len(self.statuses) + 1
            before(call)
            self.sizes.append(batch.n_tokens)
            self.statuses.append(decode(ctx, batch))
            after(call)
            return self.statuses[-1]

        monkeypatch.setattr(llama_cpp, "llama_decode", watched)

    def run(self, work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
        """`work` on a thread of its own, the prefill's; what it returned or raised, once it ends."""
        ended: list[Any] = []

        def target() -> None:
            try:
                ended.append(work())
            except Exception as error:  # the test reads it
                ended.append(error)

        self.prefill_thread = threading.Thread(target=target, daemon=True)
        self.prefill_thread.start()
        return self.prefill_thread, ended


@dataclass
class Handover:
    """A prefill during which a request came: the statuses of its decodes when the request had the
    context, its decodes' statuses and sizes to the end, and what it ended with."""

    when_lent: list[int]
    decodes: Decodes
    snapshot: Snapshot


def request_during_prefill(
    engine: Engine,
    prefix: Prefix,
    monkeypatch: pytest.MonkeyPatch,
    call: int,
    *,
    after: bool = False,
    wait_s: float = WAIT_S,
) -> Handover:
    """Prefill `prefix` on a thread of its own while a request (a borrower of a context) comes as the
    prefill's decode `call` starts (with `after`: once it has returned) and waits for a context; the
    request lets its context go once lent. Every wait is bounded by `wait_s`."""
    request: list[Borrower] = []

    def a_request_comes(at: int) -> None:
        if at == call:
            request.append(Borrower(engine))
            until(lambda: engine._pool.waiting("interactive") == 1, wait_s)

    decodes = Decodes(monkeypatch, after=a_request_comes) if after else Decodes(monkeypatch, a_request_comes)
    thread, ended = decodes.run(lambda: engine.prefill(prefix)[0])
    until(lambda: bool(request), wait_s)
    assert request[0].got.wait(wait_s)
    when_lent = list(decodes.statuses)
    request[0].let_go()
    thread.join(wait_s)
    assert not thread.is_alive() and isinstance(ended[0], Snapshot)
    return Handover(when_lent, decodes, ended[0])
