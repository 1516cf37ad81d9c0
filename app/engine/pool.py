"""The engine's pool of llama.cpp contexts (context.py), each lent to one piece of work at a time. The
engine's own: nothing outside app/engine/ takes more than its errors (tests/test_layering.py holds it so).

A request borrows one context. A context is handed back holding only sequence 0, so a request for
the snapshot it holds (or for the base that snapshot grew from) skips the restore: the cells
already hold the snapshot's exact bytes.

Each borrow is made for the current caller (app/engine/caller.py), and a borrower whose work is stopped
gives up its wait instead of taking a context for nobody. Which waiting borrower a context goes to,
whether a prefill hands its context over (prefill.py) and which prefill's piece under way is given up for
a newcomer (where the contexts `can_give_up`) are lending.py's rules, asked with the pool's state under
its lock.

The cores are the pool's. With a side context (`answer_during_prefill`), an interactive borrower that
finds every context lent, each to a prefill or to work lent with a prefill's share of the threads
(`prefill_share`), takes the side context instead of a prefill's: the prefill keeps its context and
cells and goes on with its share, the borrower decodes with the rest. A prefill's piece under way with
more threads than its share is given up, to go on with its share; the thread count does not change a
snapshot's bytes.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
import time
from collections.abc import Iterator

from app.engine import lending
from app.engine.bindings import EngineError
from app.engine.caller import LANES, Caller, Lane, Signal, current
from app.engine.context import Context
from app.engine.kv_settings import KvSettings
from app.engine.lending import Lent, PoolState, Ticket, prefill_share
from app.engine.snapshot import Snapshot


class ContextPool:
    """A model's contexts, all made alike, each lent to one piece of work at a time, interactive work first;
    and, where opened, the side context: lent only to an interactive request while a prefill holds a context."""

    def __init__(
        self, model: ctypes.c_void_p, kv: KvSettings, threads: int, *, encoder: bool, tap: int | None, can_give_up: bool
    ) -> None:
        """`can_give_up`: a prefill's piece under way may be given up (Context)."""
        self._model, self._kv, self._threads, self._encoder, self._tap = model, kv, threads, encoder, tap
        self.can_give_up = can_give_up
        self._contexts: list[Context] = []
        self._idle: list[Context] = []  # least recently used first
        self._idle_changed = threading.Condition()
        # Borrowers waiting, in the order they came, each with its caller (whose lane may change: a
        # promoted prefill's): a lane's contexts go to its first waiter, so a prefill that hands its
        # context over goes behind the request it handed it to.
        self._waiting: dict[Ticket, Caller] = {}
        self._loans: dict[Context, Caller] = {}  # contexts lent (the side context too), and to whom
        self._busy_s: dict[Lane, float] = dict.fromkeys(LANES, 0.0)  # how long contexts were lent, per lane
        self._waited_s: dict[Lane, float] = dict.fromkeys(LANES, 0.0)  # how long borrowers waited, per lane
        self._side: Context | None = None
        self._side_lent = False
        self._prefilling: set[Context] = set()  # contexts lent to a prefill

    def open(self, count: int) -> None:
        """Add `count` contexts to the pool."""
        for _ in range(count):
            ctx = Context(
                self._model, self._kv, self._threads, encoder=self._encoder, tap=self._tap, can_give_up=self.can_give_up
            )
            with self._idle_changed:
                self._contexts.append(ctx)
                self._idle.append(ctx)
                self._idle_changed.notify_all()

    def open_side(self) -> bool:
        """Open the side context, where there are threads to share and prefills to share them with; whether
        it was opened."""
        if self._threads < 2 or self._encoder or self._side is not None:
            return False
        side = Context(
            self._model,
            self._kv,
            self._threads - prefill_share(self._threads),
            tap=self._tap,
            can_give_up=self.can_give_up,
        )
        with self._idle_changed:
            self._side = side
            self._idle_changed.notify_all()
        return True

    @property
    def threads(self) -> int:
        """The threads the pool's decodes share: all of them for a context decoding alone."""
        return self._threads

    @property
    def background_cap(self) -> int:
        """The most contexts background work holds at once (lending.background_cap)."""
        return lending.background_cap(len(self._contexts))

    def lent(self, lane: Lane) -> int:
        with self._idle_changed:
            return sum(caller.lane == lane for caller in self._loans.values())

    def waiting(self, lane: Lane) -> int:
        with self._idle_changed:
            return sum(caller.lane == lane for caller in self._waiting.values())

    def someone_waits(self, lane: Lane) -> bool:
        """Whether an interactive step waits for a context that a prefill of `lane` is to hand its context
        to, between two of its pieces or in one (lending.someone_waits)."""
        with self._idle_changed:
            return lending.someone_waits(self._state(), lane)

    def prefill_threads(self) -> int:
        """The threads a prefill's next piece may use: all, or its share while the side context is lent
        or about to be."""
        with self._idle_changed:
            return lending.prefill_threads(self._state())

    def _state(self) -> PoolState:
        """What the lending rules read of the pool now (under the lock)."""
        share = prefill_share(self._threads)
        return PoolState(
            contexts=len(self._contexts),
            idle=len(self._idle),
            lent={lane: sum(caller.lane == lane for caller in self._loans.values()) for lane in LANES},
            queues={
                lane: [ticket for ticket, caller in self._waiting.items() if caller.lane == lane] for lane in LANES
            },
            threads=self._threads,
            side_opened=self._side is not None,
            side_lent=self._side_lent,
            at_share=all(ctx in self._prefilling or ctx.threads <= share for ctx in self._contexts),
        )

    def _interrupt_for(self, ticket: Ticket) -> None:
        """Give up the pieces under way that `ticket` (interactive, finding no idle context) needs given up
        (lending.to_give_up): every prefill's threads beyond its share, or one prefill's context."""
        prefilling = [ctx for ctx in self._contexts if ctx in self._prefilling]
        above, order = lending.to_give_up(self._state(), ticket, [self._loans[ctx].lane for ctx in prefilling])
        if above is not None:
            for ctx in prefilling:
                ctx.interrupt(above)
            return
        next((i for i in order if prefilling[i].interrupt()), None)

    def busy_seconds(self) -> dict[Lane, float]:
        """The seconds contexts have been lent so far, per lane (for /metrics: the work done, answered or not)."""
        with self._idle_changed:
            return dict(self._busy_s)

    def waits(self) -> dict[Lane, tuple[int, float]]:
        """Per lane: the borrowers waiting for a context now, and the seconds borrowers have waited so far."""
        with self._idle_changed:
            return {
                lane: (sum(caller.lane == lane for caller in self._waiting.values()), self._waited_s[lane])
                for lane in LANES
            }

    def decoded(self) -> tuple[int, int]:
        """The llama_decodes of text rows the contexts have run so far, and their rows (for /metrics: the
        rows per decode)."""
        with self._idle_changed:
            contexts = [*self._contexts, *([self._side] if self._side is not None else [])]
            return sum(ctx.decodes for ctx in contexts), sum(ctx.decoded_rows for ctx in contexts)

    def close(self) -> None:
        """Free every context once requests in flight have handed theirs back; borrow then raises EngineError."""
        with self._idle_changed:
            self._idle_changed.wait_for(lambda: len(self._idle) == len(self._contexts) and not self._side_lent)
            for ctx in [*self._contexts, *([self._side] if self._side is not None else [])]:
                ctx.close()
            self._contexts.clear()
            self._idle.clear()
            self._side = None
            self._idle_changed.notify_all()

    def _pick(self, lane: Lane, ticket: Ticket) -> Context | bool | None:
        """The context `ticket` may take now: an idle one (True: choose among them), the side context, or
        none yet (None)."""
        if not self._contexts:
            return True  # closed: the borrower raises
        lent = lending.may_take(self._state(), lane, ticket)
        return True if lent is Lent.IDLE else self._side if lent is Lent.SIDE else None

    @contextlib.contextmanager
    def borrow(self, wanted: Snapshot | None, *, prefill: bool = False) -> Iterator[Context]:
        """An idle context for the current caller: one that already holds `wanted` if there is one, else
        the least recently used. Cancelled, instead, once the caller is stopped while it waits.
        `prefill`: the borrower prefills (prefill.py): it may share its cores with a request on the side
        context, and never takes that one itself.

        A context is handed back holding its sequence 0, so the next request for the same
        prefix (or a prefix of it, such as the base) skips the restore. Anything that goes
        wrong on the way clears it.
        """
        with self.borrow_unless(wanted, None, prefill=prefill) as ctx:
            assert ctx is not None  # nothing to give up for
            yield ctx

    @contextlib.contextmanager
    def borrow_unless(
        self, wanted: Snapshot | None, served: Signal | None, *, prefill: bool = False
    ) -> Iterator[Context | None]:
        """`borrow`, but None once `served` is set while the caller waits: another borrower did the
        caller's work meanwhile (shared_decode.py)."""
        caller = current()
        caller.check("a context was free")
        ticket = Ticket(prefill)
        asked_at = time.perf_counter()
        with contextlib.ExitStack() as wakers:
            # what a waiter waits for besides a context: each wakes it, nothing is looked at from time to time
            wakers.enter_context(caller.stop.waking(self._wake))
            wakers.enter_context(caller.promoted.waking(functools.partial(self._promoted, ticket)))
            if served is not None:
                wakers.enter_context(served.waking(self._wake))
            with self._idle_changed:
                self._waiting[ticket] = caller
                if caller.lane == "interactive" and not self._idle:
                    self._interrupt_for(ticket)  # a prefill's piece under way gives up its context or its cores
                try:
                    while not (picked := self._pick(caller.lane, ticket)):
                        if served is not None and served.is_set():
                            break
                        caller.check("a context was free")
                        self._idle_changed.wait()
                finally:
                    del self._waiting[ticket]
                    self._waited_s[caller.lane] += time.perf_counter() - asked_at
                    self._idle_changed.notify_all()  # the next in line may take one now
                ctx: Context | None = None
                if served is not None and served.is_set():
                    pass
                elif not self._contexts:
                    raise EngineError("the engine is closed")
                elif isinstance(picked, Context):
                    ctx = picked
                    self._side_lent = True
                    self._loans[ctx] = caller
                else:
                    holding = [c for c in self._idle if wanted is not None and c.position_of(wanted) is not None]
                    ctx = holding[-1] if holding else self._idle[0]
                    self._idle.remove(ctx)
                    self._loans[ctx] = caller
                    if prefill:
                        self._prefilling.add(ctx)
                    # beside a request on the side context, the share of the threads it leaves: for the whole loan
                    ctx.set_threads(prefill_share(self._threads) if self._side_lent else self._threads)
        if ctx is None:
            yield None
            return
        lent_at = time.perf_counter()
        handed_back = False
        try:
            yield ctx
            handed_back = True
        finally:
            if not handed_back:
                ctx.clear()
            with self._idle_changed:
                if ctx is self._side:
                    self._side_lent = False
                else:
                    self._idle.append(ctx)
                    self._prefilling.discard(ctx)
                self._busy_s[self._loans.pop(ctx).lane] += time.perf_counter() - lent_at
                self._idle_changed.notify_all()  # waiters of both lanes: each has its own rule

    def _wake(self) -> None:
        """Wake the waiters: one's stop or its work done elsewhere was set."""
        with self._idle_changed:
            self._idle_changed.notify_all()

    def _promoted(self, ticket: Ticket) -> None:
        """A waiting borrower's caller was promoted to the interactive lane: it may take a context before
        background work now, and have a background prefill's piece under way given up for it."""
        with self._idle_changed:
            if ticket in self._waiting and not self._idle:
                self._interrupt_for(ticket)
            self._idle_changed.notify_all()
