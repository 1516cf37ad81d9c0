"""The engine's pool of llama.cpp contexts, and what one context does: hold a snapshot in sequence 0,
save it, take a batch of rows and decode it. The engine's own: nothing outside app/engine/ imports it
(tests/test_layering.py holds it so).

A request borrows one context. A context is handed back holding only sequence 0, so a request for
the snapshot it holds (or for the base that snapshot grew from) skips the restore: the cells
already hold the snapshot's exact bytes.

Each borrow is made for the current caller (app/engine/caller.py): interactive work is lent an idle
context before background work, background work holds at most `background_cap` contexts, and a
borrower whose work is stopped gives up its wait instead of taking a context for nobody. An
interactive borrower that finds no idle context interrupts the decode under way where it may be given
up (a prefill's piece: prefill.py).

The cores are the pool's. With a side context (`answer_during_prefill`), an interactive borrower that
finds every context lent, each to a prefill or to work lent with a prefill's share of the threads
(`prefill_share`), takes the side context instead of a prefill's: the prefill keeps its context and
cells and goes on with its share, the borrower decodes with the rest. A prefill's piece under way with
more threads than its share is given up, to go on with its share; the thread count does not change a
snapshot's bytes.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from app.engine.bindings import EngineError, llama, llama_log
from app.engine.caller import LANES, Lane, current
from app.engine.kv_settings import KvSettings
from app.engine.layer_tap import LayerTap
from app.engine.snapshot import Snapshot
from app.engine.suffix_tree import MAX_SEQUENCES, Row

# How often a borrower waiting for a context looks whether its work was stopped meanwhile: the
# stop event belongs to the request, not to the pool, so it cannot wake the pool's waiters itself.
STOP_POLL_S = 0.05

DECODE_GIVEN_UP = 2  # what llama_decode returns when its abort callback gave it up


def prefill_share(threads: int) -> int:
    """The threads a prefill keeps while a request is answered beside it on the side context: a quarter
    of them, at least one. The request is what a client waits for; the prefill only has to go on."""
    return max(1, threads // 4)


# What llama.cpp asks whether to give up a decode under way: strlen over a context's two bytes [flag,
# NUL], 1 once the flag is raised, else 0. ggml's CPU backend asks after every node of the graph; a
# Python callback would take the GIL each time and wait behind any thread holding it, where a C
# function reads a byte. strlen is that function in every C library, with no compiler needed.
@functools.cache
def _give_up_when_flagged() -> Any:
    """The abort callback, made once llama.cpp is loaded (its type comes from the bindings)."""
    c_library = ctypes.cdll.msvcrt if sys.platform == "win32" else ctypes.CDLL(None)
    address = ctypes.cast(c_library.strlen, ctypes.c_void_p).value
    assert address is not None  # a function the C library exports
    return llama.ggml_abort_callback(address)


class _GivingUp(threading.local):
    """The context whose interruptible decode this thread runs, if any."""

    ctx: Context | None = None


_giving_up = _GivingUp()


def _not_given_up_on_purpose(record: logging.LogRecord) -> bool:
    """llama.cpp logs a given-up decode as a failed one (errors, a warning): one `interrupt`ed asked for
    it, and is no error. Its log lines come on the decoding thread, within the call."""
    ctx = _giving_up.ctx
    return ctx is None or ctx._give_up[0] != b"\1"


llama_log.addFilter(_not_given_up_on_purpose)


class RestoreError(EngineError):
    """A snapshot could not be restored; the context has been cleaned."""


class Context:
    """One llama_context with its reusable batch. Used by one thread at a time.

    A model without memory (an encoder: every token sees every other) gets an `encoder` context:
    embeddings on, no pooling, and a micro-batch as large as the context, since such a model takes
    a whole prompt in one piece (llama.cpp aborts the process on a longer one)."""

    def __init__(
        self, model: ctypes.c_void_p, kv: KvSettings, threads: int, encoder: bool = False, tap: int | None = None
    ) -> None:
        params = llama.llama_context_default_params()
        self.tap = None if tap is None else LayerTap(tap)  # the context's own: one decode at a time
        if self.tap is not None:
            params.cb_eval = self.tap.callback
        kv.apply(params)
        # Raised by `interrupt` while an interruptible decode runs: llama.cpp then gives the decode up.
        self._give_up = ctypes.create_string_buffer(2)
        self._interruptible = False
        self._give_up_lock = threading.Lock()  # `interrupt` comes from other threads
        params.abort_callback = _give_up_when_flagged()
        params.abort_callback_data = ctypes.cast(self._give_up, ctypes.c_void_p)
        params.n_seq_max = MAX_SEQUENCES
        params.n_threads = params.n_threads_batch = threads
        self.threads = threads
        self._decoding_threads = 0  # the threads of the interruptible decode under way (0: none)
        params.no_perf = True
        if encoder:
            params.n_ubatch = params.n_batch = kv.n_ctx
            params.embeddings = True
            params.pooling_type = llama.LLAMA_POOLING_TYPE_NONE
        n_ctx = kv.n_ctx
        self.ctx = llama.llama_init_from_model(model, params)
        if not self.ctx:
            raise EngineError(f"llama.cpp could not create a context (n_ctx={n_ctx})")
        self.memory = llama.llama_get_memory(self.ctx)  # None for a model without memory
        self.n_ctx = n_ctx
        # Room for every sequence on each token: a token several suffixes share is in all of theirs.
        self.batch = llama.llama_batch_init(n_ctx, 0, MAX_SEQUENCES)
        self.prompt = llama.llama_batch_ext_init(self.ctx) if encoder else None  # a whole prompt, with its marks
        # Snapshots whose exact bytes sequence 0 holds, shortest first (a base, then what was
        # prefilled on it); sequence 0 is the only sequence left between requests. Weak: a context
        # must not keep alive a snapshot the RAM tier has evicted (its bytes would then be counted
        # nowhere), and a request can only ask for a snapshot it holds itself.
        self.held: tuple[weakref.ref[Snapshot], ...] = ()

    def set_threads(self, threads: int) -> None:
        """Decode with `threads` threads from the next decode on (it does not change what a decode computes)."""
        if threads != self.threads:
            llama.llama_set_n_threads(self.ctx, threads, threads)
            self.threads = threads

    def clear(self) -> None:
        if self.memory:
            llama.llama_memory_clear(self.memory, False)  # cells emptied; stale data stays masked
        self.held = ()

    def position_of(self, snapshot: Snapshot) -> int | None:
        """Where `snapshot` stands in `held` (compared by identity), or None."""
        return next((i for i, held in enumerate(self.held) if held() is snapshot), None)

    def holding(self, snapshot: Snapshot) -> None:
        """Sequence 0 now also holds `snapshot` (saved from it after what it held before)."""
        self.held = (*self.held, weakref.ref(snapshot))

    def hold(self, snapshot: Snapshot) -> None:
        """Make sequence 0 hold exactly `snapshot`: cut back to it when the context holds it
        already (the cells keep the very bytes the snapshot has), else clear and restore."""
        position = self.position_of(snapshot)
        # A memory that cannot drop a tail of a sequence (recurrent models) answers False: restore.
        # seq_rm takes positions: an M-RoPE image fills more cells than it advances positions
        if position is not None and llama.llama_memory_seq_rm(self.memory, 0, snapshot.next_pos, -1):
            self.held = self.held[: position + 1]
            return
        self.clear()
        self.restore(snapshot, 0)
        self.held = (weakref.ref(snapshot),)

    def restore(self, snapshot: Snapshot, seq: int) -> None:
        """Restore `snapshot` into sequence `seq`, in the free cells after those in use."""
        blob = snapshot.data
        read = llama.llama_state_seq_set_data(
            self.ctx, ctypes.cast(ctypes.c_char_p(blob), ctypes.POINTER(ctypes.c_uint8)), len(blob), seq
        )
        if read != len(blob):  # borrow clears the context on the way out: never a half-restored sequence
            raise RestoreError(f"llama.cpp restored {read} of {len(blob)} snapshot bytes")

    def save(self) -> bytes:
        """Sequence 0's state (llama_state_seq_get_data): a snapshot's bytes."""
        size = llama.llama_state_seq_get_size(self.ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        written = llama.llama_state_seq_get_data(self.ctx, buf, size, 0)
        if written != size:
            raise EngineError(f"llama.cpp saved {written} of {size} state bytes")
        return ctypes.string_at(buf, size)

    def fill(self, entries: Sequence[Row]) -> None:
        """Load (token, position, sequences, wants_logits) rows into the context's batch."""
        if len(entries) > self.n_ctx:
            raise ValueError(f"{len(entries)} tokens exceed the batch of {self.n_ctx}")
        batch = self.batch
        for i, (token, pos, seqs, wants_logits) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = len(seqs)
            for k, seq in enumerate(seqs):
                batch.seq_id[i][k] = seq
            batch.logits[i] = wants_logits
        batch.n_tokens = len(entries)

    def read_rows(self, read_layer: bool) -> None:
        """Start the tap, if any, anew: with `read_layer` it reads its layer's rows of the decodes from
        here on (a prefill's text and images alike: an image's decodes go through this context too)."""
        if self.tap is not None:
            self.tap.clear()
            self.tap.reading = read_layer

    def decode(self, *, read_layer: bool = False, more_rows: bool = False) -> None:
        """Decode the batch `fill` loaded; with `read_layer` the tap, if any, reads its layer's rows
        (`more_rows`: after those read since `read_rows`)."""
        if not more_rows:
            self.read_rows(read_layer)
        status = llama.llama_decode(self.ctx, self.batch)
        if status != 0:  # borrow clears the context on the way out
            raise EngineError(f"llama_decode failed with status {status}")

    def decode_unless_wanted(self, wanted: Callable[[], bool]) -> bool:
        """Decode the batch `fill` loaded, one micro-batch at most, unless the context is `wanted()` before
        it starts or `interrupt`ed while it runs: then False, and the cells are those before the call
        (llama.cpp removes a given-up micro-batch's cells). The tap, if reading, goes on reading (a
        given-up decode may have added rows to it)."""
        with self._give_up_lock:
            self._give_up[0] = b"\0"
            self._interruptible = True
            self._decoding_threads = self.threads
        try:
            if wanted():  # after arming: a waiter that came meanwhile either is seen here or interrupts
                return False
            _giving_up.ctx = self
            status = llama.llama_decode(self.ctx, self.batch)
        finally:
            _giving_up.ctx = None
            with self._give_up_lock:
                self._interruptible = False
                self._decoding_threads = 0
                self._give_up[0] = b"\0"
        if status == DECODE_GIVEN_UP:
            return False
        if status != 0:  # borrow clears the context on the way out
            raise EngineError(f"llama_decode failed with status {status}")
        return True

    def interrupt(self, above: int = 0) -> None:
        """Give up the decode under way if it is an interruptible one (`decode_unless_wanted`) with more
        than `above` threads: someone waits for this context, or for some of the cores it uses. From any
        thread."""
        with self._give_up_lock:
            if self._interruptible and self._decoding_threads > above:
                self._give_up[0] = b"\1"

    def close(self) -> None:
        if self.prompt is not None:
            llama.llama_batch_ext_free(self.prompt)
        llama.llama_batch_free(self.batch)
        llama.llama_free(self.ctx)


def keeps_memory(model: ctypes.c_void_p, kv: KvSettings, threads: int) -> bool:
    """Whether the model keeps a memory of what it read (a KV cache, a recurrent state). A model
    without (laya, lfm2-d1-omni, clef) reads each prompt whole; llama.cpp says which only through a
    context, so one is made to ask."""
    probe = Context(model, kv, threads)
    try:
        return bool(probe.memory)
    finally:
        probe.close()


@dataclass(frozen=True, eq=False)
class _Ticket:
    """A borrower's place in its lane's queue; a prefill never takes the side context."""

    prefill: bool


class ContextPool:
    """A model's contexts, all made alike, each lent to one piece of work at a time, interactive work first;
    and, where opened, the side context: lent only to an interactive request while a prefill holds a context."""

    def __init__(self, model: ctypes.c_void_p, kv: KvSettings, threads: int, *, encoder: bool, tap: int | None) -> None:
        self._model, self._kv, self._threads, self._encoder, self._tap = model, kv, threads, encoder, tap
        self._contexts: list[Context] = []
        self._idle: list[Context] = []  # least recently used first
        self._idle_changed = threading.Condition()
        # Borrowers waiting, per lane, in the order they came: a lane's contexts go to its first waiter,
        # so a prefill that hands its context over goes behind the request it handed it to.
        self._queues: dict[Lane, collections.deque[_Ticket]] = {lane: collections.deque() for lane in LANES}
        self._lent: dict[Lane, int] = dict.fromkeys(LANES, 0)
        self._busy_s: dict[Lane, float] = dict.fromkeys(LANES, 0.0)  # how long contexts were lent, per lane
        self._side: Context | None = None
        self._side_lent = False
        self._prefilling: set[Context] = set()  # contexts lent to a prefill

    def open(self, count: int) -> None:
        """Add `count` contexts to the pool."""
        for _ in range(count):
            ctx = Context(self._model, self._kv, self._threads, encoder=self._encoder, tap=self._tap)
            with self._idle_changed:
                self._contexts.append(ctx)
                self._idle.append(ctx)
                self._idle_changed.notify_all()

    def open_side(self) -> bool:
        """Open the side context, where there are threads to share and prefills to share them with; whether
        it was opened."""
        if self._threads < 2 or self._encoder or self._side is not None:
            return False
        side = Context(self._model, self._kv, self._threads - prefill_share(self._threads), tap=self._tap)
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
        """The most contexts background work holds at once: half the pool, at least one."""
        return max(1, len(self._contexts) // 2)

    def lent(self, lane: Lane) -> int:
        with self._idle_changed:
            return self._lent[lane]

    def waiting(self, lane: Lane) -> int:
        with self._idle_changed:
            return len(self._queues[lane])

    def someone_waits(self) -> bool:
        """Whether an interactive caller waits for a context that none is idle for, the side context
        included: a prefill then hands its context over, between two of its pieces or in one."""
        with self._idle_changed:
            return self._someone_waits()

    def prefill_threads(self) -> int:
        """The threads a prefill's next piece may use: all, or its share while the side context is lent
        or about to be."""
        with self._idle_changed:
            return self._prefill_threads()

    def _someone_waits(self) -> bool:
        if self._idle:
            return False
        side_free = self._side_free()
        return any(ticket.prefill or not side_free for ticket in self._queues["interactive"])

    def _side_free(self) -> bool:
        """Whether the side context may be lent now: every context is lent, and each to a prefill (which
        gives up threads beyond its share) or to work lent with its share already."""
        if self._side is None or self._side_lent or self._idle:
            return False
        share = prefill_share(self._threads)
        return all(ctx in self._prefilling or ctx.threads <= share for ctx in self._contexts)

    def _prefill_threads(self) -> int:
        beside = self._side_lent or any(not ticket.prefill for ticket in self._queues["interactive"])
        return prefill_share(self._threads) if self._side is not None and beside else self._threads

    def busy_seconds(self) -> dict[Lane, float]:
        """The seconds contexts have been lent so far, per lane (for /metrics: the work done, answered or not)."""
        with self._idle_changed:
            return dict(self._busy_s)

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

    def _pick(self, lane: Lane, ticket: _Ticket) -> Context | bool | None:
        """The context `ticket` may take now: an idle one (True: choose among them), the side context, or
        none yet (None)."""
        if not self._contexts:
            return True  # closed: the borrower raises
        queue = self._queues[lane]
        if self._idle and queue[0] is ticket:
            if lane == "interactive":
                return True
            if not self._queues["interactive"] and self._lent["background"] < self.background_cap:
                return True
        if lane == "interactive" and self._side_free():
            first = next((waiter for waiter in queue if not waiter.prefill), None)
            if first is ticket:
                return self._side
        return None

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
        self, wanted: Snapshot | None, served: threading.Event | None, *, prefill: bool = False
    ) -> Iterator[Context | None]:
        """`borrow`, but None once `served` is set while the caller waits: another borrower did the
        caller's work meanwhile (shared_decode.py). Whoever sets it hands a context back afterwards,
        which wakes the waiters."""
        caller = current()
        caller.check("a context was free")
        ticket = _Ticket(prefill)
        with self._idle_changed:
            self._queues[caller.lane].append(ticket)
            if caller.lane == "interactive" and not self._idle:
                # a prefill's piece under way gives its context up, or the cores beyond its share (prefill.py)
                above = 0 if self._someone_waits() else self._prefill_threads()
                for lent in self._contexts:
                    lent.interrupt(above)
            try:
                while not (picked := self._pick(caller.lane, ticket)):
                    if served is not None and served.is_set():
                        break
                    self._idle_changed.wait(STOP_POLL_S)
                    caller.check("a context was free")
            finally:
                self._queues[caller.lane].remove(ticket)
                self._idle_changed.notify_all()  # the next in line may take one now
            ctx: Context | None = None
            if served is not None and served.is_set():
                pass
            elif not self._contexts:
                raise EngineError("the engine is closed")
            elif isinstance(picked, Context):
                ctx = picked
                self._side_lent = True
                self._lent[caller.lane] += 1
            else:
                holding = [c for c in self._idle if wanted is not None and c.position_of(wanted) is not None]
                ctx = holding[-1] if holding else self._idle[0]
                self._idle.remove(ctx)
                self._lent[caller.lane] += 1
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
                self._lent[caller.lane] -= 1
                self._busy_s[caller.lane] += time.perf_counter() - lent_at
                self._idle_changed.notify_all()  # waiters of both lanes: each has its own rule
