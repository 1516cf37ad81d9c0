"""llama_decode watched on a prefill's thread: a hook as each of its decodes starts and once it has
returned, and the status and size of each, for tests that make requests come at a given moment of a
prefill."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from app.engine import bindings


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
