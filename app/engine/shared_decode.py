"""The question decodes of several requests in one `llama_decode` (the model setting `batch_requests`).

A request whose prefix snapshot is ready asks the model's scheduler (pool.py) for a context with its
question decode. The scheduler's loop, when it lends a context to the first of them, takes the others
of its lane waiting then into the same decode (as many as one micro-batch of rows, the context's cells
and its sequences hold: lending.companions), and makes the first one's caller lead it: it restores each
prefix into a sequence of its own (as llama-server's prompt cache restores a slot's), copies it to one
sequence per question, and decodes every request's suffix rows in one llama_decode. Then it reads each
request's logits and hands each request its readouts; a request taken into another's decode waits for
them, or for its own stop.

A leader that finds only its own request decodes it exactly as a request alone is decoded without this
setting, so a request alone stays bit-identical to itself (hit, miss, cache off). Beside other
requests its numbers move by the spread docs/exactness.md measured (other cells and rows change
the order ggml sums in), and its response says so (`beside`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar, cast

from app.engine.bindings import llama
from app.engine.caller import Caller, Lane, Signal, current, wait_either, working_for
from app.engine.context import Context
from app.engine.lending import Questions
from app.engine.pool import ContextPool
from app.engine.snapshot import Snapshot
from app.engine.suffix_tree import Row
from app.errors import Cancelled

T = TypeVar("T")


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


class SharedDecodes:
    """A model's question decodes that the scheduler may put several of into one llama_decode, and the
    leading of one such decode."""

    def __init__(self, pool: ContextPool) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self.decodes = 0  # llama_decodes led so far
        self.requests = 0  # requests answered in them

    def decode(self, job: SharedJob[T]) -> SharedJob[T]:
        """`job` decoded, by this thread or in another's decode; raises what its decode raised."""
        size = Questions(len(job.rows), job.prefix.n_tokens + len(job.rows), job.n_sequences)
        with self._pool.borrow_for_questions(job.prefix, size, job) as lent:
            if lent is not None:
                ctx, taken = lent
                self._lead(ctx, cast(list[SharedJob[object]], taken))
        if not job.done.is_set():  # taken into another's decode, still at work: wait for it, as for a context
            wait_either(job.done, job.stop)
            if not job.done.is_set():
                current().check("a decode of questions")
        if job.error is not None:
            raise job.error
        return job

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
                self._pool.decoded_together(taken[0].lane, len(working))
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
