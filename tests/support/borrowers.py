"""A thread that borrows one of an engine's pooled contexts and holds it until the test lets it go."""

from __future__ import annotations

import threading

from app.engine.caller import Caller, working_for
from app.engine.context import Context
from app.engine.engine import Engine

WAIT_S = 30  # every wait here is bounded; a healthy run takes milliseconds


class Borrower:
    """Borrows a context for `work` (as a prefill, with `prefill`), says when it has one (`got`, `ctx`, and
    its `name` added to `lent`), and holds it until `let_go`. What its borrow raised is in `error`."""

    def __init__(
        self,
        engine: Engine,
        work: Caller | None = None,
        lent: list[str] | None = None,
        name: str = "",
        *,
        prefill: bool = False,
    ) -> None:
        self.got, self.go = threading.Event(), threading.Event()
        self.ctx: Context | None = None
        self.error: Exception | None = None
        self.thread = threading.Thread(
            target=self._run, args=(engine, work or Caller(), lent, name, prefill), daemon=True
        )
        self.thread.start()

    def _run(self, engine: Engine, work: Caller, lent: list[str] | None, name: str, prefill: bool) -> None:
        try:
            with working_for(work), engine._pool.borrow(None, prefill=prefill) as ctx:
                self.ctx = ctx
                if lent is not None:
                    lent.append(name)
                self.got.set()
                assert self.go.wait(WAIT_S)
        except Exception as error:  # the test reads it
            self.error = error

    def let_go(self) -> None:
        """Hand the context back; a borrower let go held one, so its borrow raised nothing."""
        self.go.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive() and self.error is None
