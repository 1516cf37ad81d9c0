"""A model's scheduler: its llama.cpp contexts (context.py) and the one loop thread that decides which
waiting step of work each is lent to. The engine's own: nothing outside app/engine/ takes more than its
errors (tests/test_layering.py holds it so).

A step of work (a prefill's turn, a decode of questions, a prior, a whole prompt) asks for a context with
a ticket and waits for the loop's answer; it never decides for itself. The loop wakes whenever something
it decides on changes (a ticket comes, a context is handed back, a waiter's stop is set, its caller is
promoted) and, under the pool's lock, in one place:
- lends idle contexts and the side context to the waiting tickets, by lending.py's rules;
- gives up the prefill pieces under way that an interactive newcomer needs given up (lending.to_give_up),
  where the contexts `can_give_up`;
- with `batch_requests`, decides which waiting question decodes go into one llama_decode (lending.companions),
  and holds a context a moment for the company its lane's last decode had (lending.waits_for_company);
- resolves the tickets of stopped callers (Cancelled) and, once the pool is closed, of everyone.
A waiter is woken by its ticket's answer and by nothing else: nothing polls.

A context is handed back holding only sequence 0, so a request for the snapshot it holds (or for the base
that snapshot grew from) skips the restore: the cells already hold the snapshot's exact bytes.

The cores are the pool's. With a side context (`answer_during_prefill`), an interactive borrower that
finds every context lent, each to a prefill or to work lent with a prefill's share of the threads
(`prefill_share`), takes the side context instead of a prefill's: the prefill keeps its context and
cells and goes on with its share, the borrower decodes with the rest. A prefill's piece under way with
more threads than its share is given up, to go on with its share; the thread count does not change a
snapshot's bytes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from app.engine import lending
from app.engine.bindings import EngineError
from app.engine.caller import LANES, Caller, Lane, Signal, current
from app.engine.context import Context
from app.engine.lending import LastDecode, Lent, PoolState, Questions, Ticket, prefill_share
from app.engine.snapshot import Snapshot
from app.engine.suffix_tree import MAX_SEQUENCES
from app.errors import Cancelled

log = logging.getLogger("onepass.engine")


@dataclass(eq=False)
class _Waiter:
    """A ticket waiting for the loop's answer: for whom, the snapshot it would like a context to hold, and
    (a question decode) the job a leader decodes. The answer: a context (`ctx`; for a leader, the jobs its
    decode takes, its own first, in `jobs`), taken into another's decode (no ctx), or `error`."""

    ticket: Ticket
    caller: Caller
    wanted: Snapshot | None
    job: object | None
    asked_at: float = field(default_factory=time.perf_counter)
    answered: Signal = field(default_factory=Signal)
    ctx: Context | None = None
    jobs: list[object] = field(default_factory=list)
    error: BaseException | None = None
    interactive_seen: bool = False  # the loop has decided on interrupts for it in the interactive lane


class ContextPool:
    """A model's contexts, all made alike, each lent to one piece of work at a time by the loop, interactive
    work first; and, where opened, the side context: lent only to an interactive request while a prefill
    holds a context."""

    def __init__(
        self, make: Callable[[int], Context], threads: int, *, can_give_up: bool, side: bool, max_rows: int = 0
    ) -> None:
        """`make(threads)`: a new context, made alike each time, decoding with that many threads.
        `can_give_up`: a prefill's piece under way may be given up (Context). `side`: a side context may be
        opened (not for a model without memory). `max_rows`: the rows one llama_decode of several requests'
        questions holds (one micro-batch)."""
        self._make, self._threads, self._side_allowed = make, threads, side
        self.can_give_up = can_give_up
        self._max_rows = max_rows
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # the loop's wake-up, and close's
        self._contexts: list[Context] = []
        self._idle: list[Context] = []  # least recently used first
        self._closed = False
        self._asked: list[_Waiter] = []  # tickets the loop has not seen yet
        # Tickets waiting, in the order they came: a lane's contexts go to its first waiter, so a prefill
        # that hands its context over goes behind the request it handed it to.
        self._waiting: list[_Waiter] = []
        self._loans: dict[Context, Caller] = {}  # contexts lent (the side context too), and to whom
        self._busy_s: dict[Lane, float] = dict.fromkeys(LANES, 0.0)  # how long contexts were lent, per lane
        self._waited_s: dict[Lane, float] = dict.fromkeys(LANES, 0.0)  # how long borrowers waited, per lane
        self._side: Context | None = None
        self._side_lent = False
        self._prefilling: set[Context] = set()  # contexts lent to a prefill
        self._last = {lane: LastDecode() for lane in LANES}  # each lane's last shared question decode
        self._gathering: dict[Lane, float] = {}  # per lane: until when a context is held for company
        self._loop = threading.Thread(target=self._run, name="onepass-scheduler", daemon=True)
        self._loop.start()

    def open(self, count: int) -> None:
        """Add `count` contexts to the pool."""
        for _ in range(count):
            ctx = self._make(self._threads)
            with self._lock:
                self._contexts.append(ctx)
                self._idle.append(ctx)
                self._changed.notify_all()

    def open_side(self) -> bool:
        """Open the side context, where there are threads to share and prefills to share them with; whether
        it was opened."""
        if self._threads < 2 or not self._side_allowed or self._side is not None:
            return False
        side = self._make(self._threads - prefill_share(self._threads))
        with self._lock:
            self._side = side
            self._changed.notify_all()
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
        with self._lock:
            return sum(caller.lane == lane for caller in self._loans.values())

    def waiting(self, lane: Lane) -> int:
        """The tickets of `lane` the loop has seen and not answered yet."""
        with self._lock:
            return sum(waiter.caller.lane == lane for waiter in self._waiting)

    def questions_waiting(self) -> int:
        """The question decodes waiting to be taken into a llama_decode (batch_requests)."""
        with self._lock:
            return sum(waiter.job is not None for waiter in self._waiting)

    def someone_waits(self, lane: Lane) -> bool:
        """Whether an interactive step waits for a context that a prefill of `lane` is to hand its context
        to, between two of its pieces or in one (lending.someone_waits)."""
        with self._lock:
            return lending.someone_waits(self._state(), lane)

    def prefill_threads(self) -> int:
        """The threads a prefill's next piece may use: all, or its share while the side context is lent
        or about to be."""
        with self._lock:
            return lending.prefill_threads(self._state())

    def busy_seconds(self) -> dict[Lane, float]:
        """The seconds contexts have been lent so far, per lane (for /metrics: the work done, answered or not)."""
        with self._lock:
            return dict(self._busy_s)

    def waits(self) -> dict[Lane, tuple[int, float]]:
        """Per lane: the borrowers waiting for a context now, and the seconds borrowers have waited so far."""
        with self._lock:
            return {
                lane: (sum(waiter.caller.lane == lane for waiter in self._waiting), self._waited_s[lane])
                for lane in LANES
            }

    def decoded(self) -> tuple[int, int]:
        """The llama_decodes of text rows the contexts have run so far, and their rows (for /metrics: the
        rows per decode)."""
        with self._lock:
            contexts = [*self._contexts, *([self._side] if self._side is not None else [])]
            return sum(ctx.decodes for ctx in contexts), sum(ctx.decoded_rows for ctx in contexts)

    def decoded_together(self, lane: Lane, answered: int) -> None:
        """A shared question decode of `lane` answered `answered` requests: its lane's next decode expects
        them back, and those still waiting (lending.waits_for_company)."""
        with self._lock:
            left = sum(w.job is not None and w.caller.lane == lane for w in (*self._waiting, *self._asked))
            self._last[lane] = LastDecode(answered + left, time.monotonic())

    def close(self) -> None:
        """Free every context once requests in flight have handed theirs back; a borrow then raises
        EngineError, and the loop ends."""
        with self._lock:
            self._changed.wait_for(lambda: len(self._idle) == len(self._contexts) and not self._side_lent)
            for ctx in [*self._contexts, *([self._side] if self._side is not None else [])]:
                ctx.close()
            self._contexts.clear()
            self._idle.clear()
            self._side = None
            self._closed = True
            self._changed.notify_all()
        self._loop.join()

    @contextlib.contextmanager
    def borrow(self, wanted: Snapshot | None, *, prefill: bool = False) -> Iterator[Context]:
        """An idle context for the current caller, once the loop lends it one: one that already holds
        `wanted` if there is one, else the least recently used. Cancelled, instead, once the caller is
        stopped while it waits. `prefill`: the borrower prefills (prefill.py): it may share its cores with
        a request on the side context, and never takes that one itself.

        A context is handed back holding its sequence 0, so the next request for the same prefix (or a
        prefix of it, such as the base) skips the restore. Anything that goes wrong on the way clears it.
        """
        waiter = self._ask(Ticket(prefill), wanted, None)
        assert waiter.ctx is not None  # only a question decode is taken into another's
        with self._lent(waiter.ctx, waiter.caller) as ctx:
            yield ctx

    @contextlib.contextmanager
    def borrow_for_questions(
        self, wanted: Snapshot | None, questions: Questions, job: object
    ) -> Iterator[tuple[Context, list[object]] | None]:
        """A question decode that others' may join (batch_requests): a context and the jobs its one
        llama_decode takes (`job` first), when the loop makes this caller lead; None when the loop took
        `job` into another's decode."""
        waiter = self._ask(Ticket(False, questions), wanted, job)
        if waiter.ctx is None:
            yield None
            return
        with self._lent(waiter.ctx, waiter.caller) as ctx:
            yield ctx, waiter.jobs

    def _ask(self, ticket: Ticket, wanted: Snapshot | None, job: object | None) -> _Waiter:
        """Hand the loop a ticket for the current caller and wait for its answer."""
        caller = current()
        caller.check("a context was free")
        waiter = _Waiter(ticket, caller, wanted, job)
        # the loop decides again when the caller is stopped or promoted while it waits
        with caller.stop.waking(self._wake), caller.promoted.waking(self._wake):
            with self._lock:
                if self._closed:
                    raise EngineError("the engine is closed")
                self._asked.append(waiter)
                self._changed.notify_all()
            waiter.answered.wait()
        if waiter.error is not None:
            raise waiter.error
        return waiter

    @contextlib.contextmanager
    def _lent(self, ctx: Context, caller: Caller) -> Iterator[Context]:
        """`ctx`, lent by the loop to `caller`, handed back afterwards (cleared if the work failed)."""
        lent_at = time.perf_counter()
        handed_back = False
        try:
            yield ctx
            handed_back = True
        finally:
            if not handed_back:
                ctx.clear()
            with self._lock:
                if ctx is self._side:
                    self._side_lent = False
                else:
                    self._idle.append(ctx)
                    self._prefilling.discard(ctx)
                self._busy_s[self._loans.pop(ctx).lane] += time.perf_counter() - lent_at
                self._changed.notify_all()

    def _wake(self) -> None:
        """Wake the loop: a waiter's stop was set or its caller promoted."""
        with self._lock:
            self._changed.notify_all()

    # The loop, and what it calls: all under the lock.

    def _run(self) -> None:
        """The loop: decide, then sleep until something changes (or a context held for company is due)."""
        with self._lock:
            while True:
                try:
                    due = self._decide()
                except Exception as error:  # a bug here must fail the waiters, not hang them
                    log.exception("the scheduler's loop failed")
                    for waiter in [*self._asked, *self._waiting]:
                        self._answer(waiter, error)
                    self._asked.clear()
                    due = None
                if self._closed and not self._waiting and not self._asked:
                    return
                self._changed.wait(None if due is None else max(0.0, due - time.monotonic()))

    def _decide(self) -> float | None:
        """Every choice, once: answer the stopped (and, closed, everyone), give up the pieces newcomers need,
        lend what may be lent. When a context is held for company: the moment that ends (monotonic)."""
        self._waiting.extend(self._asked)
        self._asked.clear()
        for waiter in list(self._waiting):
            if self._closed or not self._contexts:
                self._answer(waiter, EngineError("the engine is closed"))
            elif waiter.caller.stopped:
                self._answer(waiter, Cancelled("cancelled before a context was free"))
        for waiter in self._waiting:
            if waiter.caller.lane == "interactive" and not waiter.interactive_seen:
                waiter.interactive_seen = True
                if not self._idle:
                    self._interrupt_for(waiter.ticket)  # a prefill's piece under way gives up its context or cores
        due: float | None = None
        lent_one = True
        while lent_one:
            lent_one, due = self._lend_one()
        return due

    def _lend_one(self) -> tuple[bool, float | None]:
        """Lend one context to the first waiter that may take one now; (whether one was lent, until when a
        context is held for a question decode's company)."""
        state = self._state()
        held_until: float | None = None
        for waiter in self._waiting:
            lane = waiter.caller.lane
            lent = lending.may_take(state, lane, waiter.ticket)
            if lent is None:
                continue
            taken = [waiter]
            if waiter.ticket.questions is not None:
                queue = [w for w in self._waiting if w.job is not None and w.caller.lane == lane]
                now = time.monotonic()
                if lending.waits_for_company(self._last[lane], [w.ticket for w in queue], self._max_rows, now):
                    due = self._gathering.setdefault(lane, now + lending.GATHER_S)
                    if now < due:  # held for the company: another lane's waiter may still be lent one
                        held_until = due if held_until is None else min(held_until, due)
                        continue
                self._gathering.pop(lane, None)
                ctx = self._side if lent is Lent.SIDE else self._idle[0]
                assert ctx is not None
                chosen = lending.companions([w.ticket for w in queue], self._max_rows, ctx.n_ctx, MAX_SEQUENCES)
                taken = [w for w in queue if w.ticket in chosen]
                assert taken[0] is waiter  # the first of its lane's question decodes: no other may be lent one first
                waiter.jobs = [w.job for w in taken if w.job is not None]
            self._lend(waiter, lent)
            for follower in taken[1:]:
                self._answer(follower, None)  # taken into the leader's decode
            return True, None
        return False, held_until

    def _lend(self, waiter: _Waiter, lent: Lent) -> None:
        """Lend `waiter` the side context, or the idle context holding what it wants (else the least
        recently used one)."""
        if lent is Lent.SIDE:
            ctx = self._side
            assert ctx is not None
            self._side_lent = True
        else:
            wanted = waiter.wanted
            holding = [c for c in self._idle if wanted is not None and c.position_of(wanted) is not None]
            ctx = holding[-1] if holding else self._idle[0]
            self._idle.remove(ctx)
            if waiter.ticket.prefill:
                self._prefilling.add(ctx)
            # beside a request on the side context, the share of the threads it leaves: for the whole loan
            ctx.set_threads(prefill_share(self._threads) if self._side_lent else self._threads)
        self._loans[ctx] = waiter.caller
        waiter.ctx = ctx
        self._answer(waiter, None)

    def _answer(self, waiter: _Waiter, error: BaseException | None) -> None:
        """Give `waiter` the loop's answer (what `_lend` set, or `error`) and wake it."""
        if waiter in self._waiting:
            self._waiting.remove(waiter)
        waiter.error = error
        self._waited_s[waiter.caller.lane] += time.perf_counter() - waiter.asked_at
        waiter.answered.set()

    def _state(self) -> PoolState:
        """What the lending rules read of the pool now."""
        share = prefill_share(self._threads)
        return PoolState(
            contexts=len(self._contexts),
            idle=len(self._idle),
            lent={lane: sum(caller.lane == lane for caller in self._loans.values()) for lane in LANES},
            queues={lane: [w.ticket for w in self._waiting if w.caller.lane == lane] for lane in LANES},
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
