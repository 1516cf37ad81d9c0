"""The question decodes of several requests in one `llama_decode` (the model setting `batch_requests`).

A request whose prefix snapshot is ready queues its question suffixes here, then waits for a context
like any other step. Whoever gets a context first leads: it takes the requests queued in its lane, in
the order they came, as many as one micro-batch of rows, the context's cells and its sequences hold;
restores each prefix into a sequence of its own (as llama-server's prompt cache restores a slot's),
copies it to one sequence per question, and decodes every request's suffix rows in one llama_decode.
Then it reads each request's logits and hands each request its readouts. A request taken by a leader
leaves its own wait for a context as soon as its readouts are there.

A leader that finds only its own request decodes it exactly as a request alone is decoded without this
setting, so a request alone stays bit-identical to itself (hit, miss, cache off). Beside other
requests its numbers move by the spread docs/exactness.md measured (other cells and rows change
the order ggml sums in), and its response says so (`beside`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from app.engine.bindings import llama
from app.engine.caller import LANES, Caller, Lane, Signal, current, wait_either, working_for
from app.engine.context import Context
from app.engine.pool import ContextPool
from app.engine.snapshot import Snapshot
from app.engine.suffix_tree import MAX_SEQUENCES, Row
from app.errors import Cancelled

T = TypeVar("T")

# The longest a leader waits for the company the last decode had: a few HTTP requests' worth of parsing
# and planning, a small part of one decode (docs/exactness.md#the-setting-batch_requests).
GATHER_S = 0.1


@dataclass(eq=False)
class SharedJob(Generic[T]):
    """One request's question decode, queued: its prefix, its suffixes' rows (numbered as alone: the
    prefix in sequence 0, suffix i in sequence i + 1), and how to read its readouts.

    `read(ctx, rows)`: its readouts from the decoded context, given each suffix's batch rows.
    `alone(ctx)`: its readouts decoded alone, the path of a request without this setting."""

    prefix: Snapshot
    rows: list[Row]
    paths: list[list[int]]
    lane: Lane
    stop: Signal
    read: Callable[[Context, list[list[int]]], T]
    alone: Callable[[Context], T]
    done: Signal = field(default_factory=Signal)
    result: T | None = None
    error: BaseException | None = None
    beside: int = 0  # the other requests decoded in the same llama_decode
    restore_ms: float = 0.0
    decode_ms: float = 0.0

    @property
    def n_sequences(self) -> int:
        return 1 + len(self.paths)


@dataclass
class LastDecode:
    """What a lane's last decode says of its next: how many requests its leader may expect (those the
    decode answered, whose clients send their next ones at once, and those it left queued: they did not
    fit, or came while it decoded), and when it ended (monotonic). Per lane: a fit's decode between two
    rounds of many clients says nothing of how many of them come back."""

    company: int = 1
    ended: float = -math.inf


class SharedDecodes:
    """A model's queue of question decodes, and the leading of one decode of several of them."""

    def __init__(self, pool: ContextPool, max_rows: int) -> None:
        self._pool = pool
        self._max_rows = max_rows  # one micro-batch: a request waits for one at most
        self._lock = threading.Lock()
        self._queue_grew = threading.Condition(self._lock)
        self._queued: list[SharedJob[object]] = []
        self._last = {lane: LastDecode() for lane in LANES}
        self.decodes = 0  # llama_decodes led so far
        self.requests = 0  # requests answered in them

    def decode(self, job: SharedJob[T]) -> SharedJob[T]:
        """`job` decoded, by this thread or by another's leading; raises what its decode raised."""
        with self._lock:
            self._queued.append(job)  # type: ignore[arg-type]  # the queue holds jobs of any readout type
            self._queue_grew.notify_all()
        try:
            while not job.done.is_set():
                with self._pool.borrow_unless(job.prefix, job.done) as ctx:
                    if ctx is not None:
                        with self._lock:
                            taken = self._take(job, ctx.n_ctx)
                        if taken:
                            self._lead(ctx, taken)
                # Taken by a leader on another context, still at work: wait for it, as for a context.
                wait_either(job.done, job.stop)
                if not job.done.is_set():
                    current().check("a decode of questions")
        finally:
            with self._lock:
                if job in self._queued:
                    self._queued.remove(job)  # type: ignore[arg-type]
        if job.error is not None:
            raise job.error
        return job

    def _gather(self, lane: Lane) -> None:
        """Where the last decode had company, wait a moment for as many requests of `lane` to queue, or for
        a decode's worth of rows (under the lock).

        Clients answered by one decode send their next requests at once, but a request queued in the
        meantime leads as soon as the context is free: without this, it would go alone and the others
        after it, one decode each time where one would do. Alone (one client), nobody waits; nor does a
        leader that comes after its lane's last decode's clients had their moment to come back (a lone
        request after a burst): what of them has not come is not coming at once."""
        now = time.monotonic()
        if now - self._last[lane].ended > GATHER_S:
            return
        deadline = now + GATHER_S
        while (left := deadline - time.monotonic()) > 0:
            same_lane = self._queued_in(lane)
            if len(same_lane) >= self._last[lane].company or sum(len(job.rows) for job in same_lane) >= self._max_rows:
                return
            self._queue_grew.wait(left)

    def _queued_in(self, lane: Lane) -> list[SharedJob[object]]:
        """The jobs of `lane` queued and not yet taken (under the lock): only a leader of its lane takes one."""
        return [job for job in self._queued if job.lane == lane]

    def _take(self, first: SharedJob[T], n_ctx: int) -> list[SharedJob[object]]:
        """The queued jobs one decode takes (under the lock): `first`, then others of its lane, not stopped,
        in the order they came, as many as fit; none when `first` was taken already, by a leader on another
        context, before or while this one gathered."""
        if first in self._queued:
            self._gather(first.lane)
        if first not in self._queued:
            return []
        taken: list[SharedJob[object]] = [first]  # type: ignore[list-item]  # of any readout type
        rows, cells, sequences = len(first.rows), first.prefix.n_tokens + len(first.rows), first.n_sequences
        for job in self._queued:
            if job is first or job.lane != first.lane or job.stop.is_set():
                continue
            more_rows = len(job.rows)
            more_cells = job.prefix.n_tokens + more_rows
            if (
                rows + more_rows > self._max_rows
                or cells + more_cells > n_ctx
                or sequences + job.n_sequences > MAX_SEQUENCES
            ):
                continue
            taken.append(job)
            rows, cells, sequences = rows + more_rows, cells + more_cells, sequences + job.n_sequences
        for job in taken:
            self._queued.remove(job)
        return taken

    def _lead(self, ctx: Context, taken: list[SharedJob[object]]) -> None:
        """Decode the taken jobs on `ctx` and hand each its readouts (or the error), even when the
        leader's own client has left: the others still wait. A job stopped is Cancelled by its own stop
        alone, never by the leader's."""
        try:
            working = [job for job in taken if not job.stop.is_set()]
            for job in taken:
                if job.stop.is_set():
                    job.error = Cancelled("cancelled before a decode of questions")
            if len(working) == 1:
                job = working[0]
                with working_for(Caller(job.lane, job.stop)):  # its own stop, not the leader's
                    job.result = job.alone(ctx)
            elif working:
                for job, result in zip(working, self._together(ctx, working), strict=True):
                    job.result, job.beside = result, len(working) - 1
            if working:  # counted under the lock: leaders on two contexts may finish at once
                with self._lock:
                    self.decodes += 1
                    self.requests += len(working)
                    lane = taken[0].lane
                    self._last[lane] = LastDecode(len(working) + len(self._queued_in(lane)), time.monotonic())
        except BaseException as error:
            for job in taken:
                job.error = job.error or error
            raise  # borrow clears the context on the way out
        finally:
            for job in taken:
                job.done.set()

    def _together(self, ctx: Context, jobs: Sequence[SharedJob[object]]) -> list[object]:
        """Each job's prefix restored into a sequence of its own and copied to one per question, every
        job's rows in one llama_decode; their readouts, in order."""
        began = time.perf_counter()
        ctx.clear()
        rows: list[Row] = []
        paths: list[list[list[int]]] = []
        first_seq = 0
        try:
            for job in jobs:
                ctx.restore(job.prefix, first_seq)
                for seq in range(first_seq + 1, first_seq + job.n_sequences):
                    llama.llama_memory_seq_cp(ctx.memory, first_seq, seq, -1, -1)  # shares the cells
                offset = len(rows)
                rows.extend((t, pos, tuple(first_seq + s for s in seqs), out) for t, pos, seqs, out in job.rows)
                paths.append([[offset + row for row in path] for path in job.paths])
                first_seq += job.n_sequences
            restored = time.perf_counter()
            ctx.fill(rows)
            ctx.decode()
            results = [job.read(ctx, at) for job, at in zip(jobs, paths, strict=True)]
            decoded = time.perf_counter()
        finally:
            ctx.clear()  # no one sequence 0 left to keep for the next request
        for job in jobs:
            job.restore_ms = (restored - began) * 1000
            job.decode_ms = (decoded - restored) * 1000
        return results
