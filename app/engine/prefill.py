"""A prefix prefilled into a snapshot, in pieces: its text in micro-batches, the pieces llama.cpp would
split one call into anyway (so the cells hold the same bytes as one call), each image whole through
the vision projector.

Between two pieces the prefill stops (Cancelled) once nobody waits for it any more. It hands its
context over when an interactive caller waits for one and none is idle (a request's decode; another
prefill only where this one is background work: pool.py): between two pieces, or, where
the context can give a decode up (context.Context.can_give_up: a memory that drops a tail, on the CPU),
in the middle of one: llama.cpp gives the text piece under way up (its cells are dropped; it is decoded
again later). Elsewhere (a recurrent or hybrid memory, which cannot go back; a GPU, which never gives a
decode up) the request waits for the piece under way. The prefill saves what it has done as a
snapshot, never one whose cells reach past its tokens, lets the other go first, and goes on from that
snapshot when it has a context again. Restoring a snapshot gives the cells its very bytes, and the
tapped layer's rows of the pieces done are carried over, so the snapshot and its state mean are those
of an uninterrupted prefill, bit for bit.
So that requests that keep coming cannot starve it, a prefill that let one go first owes a piece each
time it has the context again, which nobody takes from it: where pieces can be given up, a short one
(kv_settings.HANDOVER_PIECE), so that a short request waits for no piece of a long state (cut at or
above that size, pieces give the cells the bytes of llama.cpp's own micro-batches, measured on the
CPU); elsewhere a whole one, so that every piece stays one of llama.cpp's own micro-batches.

Where the pool has a side context, a request that comes during the prefill is answered there instead,
and the prefill keeps its context: it goes on with its share of the threads (lending.prefill_share) while
the request decodes, in short pieces where they can be given up, and with all of them again after. A
piece under way with more threads than its share is given up, where it can be, and decoded again with
its share; the thread count does not change the bytes.

A prefill stopped between two pieces says what it had done (`Stopped.partial`), and a later prefill
of the same tokens from the same base may go on from there (`resume`): a client that gives up and
retries, as the SDK does, finds the pieces its first attempt paid for.
"""

from __future__ import annotations

import collections
import functools
import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from app.engine.bindings import EngineError
from app.engine.caller import current
from app.engine.context import Context
from app.engine.kv_settings import HANDOVER_PIECE
from app.engine.pool import ContextPool
from app.engine.snapshot import ImageSpan, Prefix, Snapshot
from app.engine.vision import Vision
from app.errors import Cancelled

Piece = tuple[int, int, ImageSpan | None]  # (first cell, end, the image or None: text)


@dataclass(frozen=True)
class Partial:
    """What a stopped prefill had done: a snapshot of its first pieces, the tapped layer's rows of
    those pieces, and the cells it had started after (its base's)."""

    snapshot: Snapshot
    rows: tuple[NDArray[np.float32], ...]
    after: int


class Stopped(Cancelled):
    """A prefill stopped between two pieces because nobody waits for it; `partial`: what it had done
    (None: nothing beyond its base)."""

    def __init__(self, partial: Partial | None) -> None:
        super().__init__("cancelled between two pieces of the prefill")
        self.partial = partial


class Prefill:
    """One prefill of `prefix` (its tokens, its image spans and their files) on `pool`'s contexts; its
    restore and prefill time once run."""

    def __init__(self, pool: ContextPool, vision: Vision | None, n_ubatch: int, prefix: Prefix) -> None:
        self._pool, self._vision, self._n_ubatch = pool, vision, n_ubatch
        self.tokens, self.spans, self.images = prefix.tokens, prefix.spans, prefix.images
        self.restore_ms = self.prefill_ms = 0.0

    def run(self, base: Snapshot | None, resume: Partial | None = None) -> Snapshot:
        """The snapshot after the tokens, prefilled from `base` (a prefix of them) or from nothing, going
        on from `resume` where that is a stopped prefill of these tokens from the same base. Stopped
        (with what it had done) once nobody waits for it."""
        tokens, spans = self.tokens, self.spans
        start = base.n_tokens if base is not None else 0
        pieces = self.pieces(base)
        done = base  # the prefix prefilled so far: where the next context starts from
        rows: list[NDArray[np.float32]] = []  # the tapped layer's rows of the pieces done, in order
        if resume is not None and self._goes_on(resume, start):
            done, rows = resume.snapshot, list(resume.rows)

        def stopped() -> Stopped:
            partial = None if done is None or done.n_tokens <= start else Partial(done, tuple(rows), start)
            return Stopped(partial)

        handed_over = False  # whether it has let a request go first: its next turn then owes a piece
        while True:
            try:
                with self._pool.borrow(done, prefill=True) as ctx:
                    began = time.perf_counter()
                    if done is not None:
                        ctx.hold(done)
                    else:
                        ctx.clear()
                    self.restore_ms += _ms_since(began)
                    began = time.perf_counter()
                    first = done.n_tokens if done is not None else 0
                    position = done.next_pos if done is not None else 0
                    cell, position = self._decode(ctx, pieces, first, position, rows, owes_a_piece=handed_over)
                    self.prefill_ms += _ms_since(began)
                    if cell > first or cell == len(tokens):
                        done = Snapshot(
                            _saved(ctx, position),
                            tuple(tokens[:cell]),
                            None,
                            tuple(x for x in spans if x.offset < cell),
                        )
                    if cell < len(tokens) and current().stopped:
                        raise stopped()
                    if cell < len(tokens):  # a request waits: handed over between two pieces or in one
                        if done is not None and cell > first:
                            ctx.holding(done)  # should this context come back first, it goes on without a restore
                        handed_over = True
                        continue  # borrow again, from the prefix prefilled so far
                    state_mean = None
                    if rows and len(tokens) > (base.n_tokens if base is not None else 0):
                        state_mean = np.concatenate(rows).mean(axis=0)
                        state_mean.flags.writeable = False
                    assert done is not None  # saved above: the prefill reached the end
                    snapshot = Snapshot(done.data, tuple(tokens), state_mean, spans)
                    ctx.holding(snapshot)
                    return snapshot
            except Stopped:
                raise
            except Cancelled:  # stopped while it waited for a context again
                raise stopped() from None

    def _goes_on(self, resume: Partial, start: int) -> bool:
        """Whether `resume` is a stopped prefill of a prefix of these tokens, begun after `start` cells."""
        held = resume.snapshot
        spans = tuple(x for x in self.spans if x.offset < held.n_tokens)
        return (
            resume.after == start
            and start < held.n_tokens < len(self.tokens)
            and held.holds(Prefix(self.tokens[: held.n_tokens], spans))
        )

    def _decode(
        self,
        ctx: Context,
        pieces: list[Piece],
        first: int,
        position: int,
        rows: list[NDArray[np.float32]],
        *,
        owes_a_piece: bool,
    ) -> tuple[int, int]:
        """Decode the pieces from cell `first` (at `position`) into sequence 0, adding the tapped layer's
        rows of each piece done to `rows`; the cell it stopped at and its position: the end, or the start
        of a piece it left for later, because nobody waits for the prefill any more or a request waits
        for the context. Where the context can give a decode up, a text piece is given up mid-way when a
        request comes (its cells are dropped, the same piece is decoded again later), except the first
        one a prefill that `owes_a_piece` decodes: one that has let requests go first goes on by at least
        that piece each time it gets the context back, however many come. There that piece is a short
        one (HANDOVER_PIECE), so the request that comes during it waits little; elsewhere every piece is
        whole."""
        todo = collections.deque(self._from(pieces, first))
        while todo:
            at, end, span = todo.popleft()
            if current().stopped:
                return at, position
            owed, owes_a_piece = owes_a_piece, False  # only the first piece is owed
            if span is not None:
                if not owed and self._pool.someone_waits(current().lane):
                    return at, position  # an image is encoded whole: handed over before it, not during it
                ctx.set_threads(self._pool.prefill_threads())
                ctx.read_rows(True)
                position = self._decode_image(ctx, span, position)
            else:
                threads = self._pool.prefill_threads()
                ctx.set_threads(threads)
                # owed, or beside a request on the side context: a short piece, the rest next (given up if
                # need be), so that the prefill has its whole context or all its cores again soon; only
                # where a piece can be given up, for elsewhere nothing takes the context mid-piece and a
                # piece cut short might round otherwise (a GPU's kernels are chosen by the batch's size)
                short = ctx.can_give_up and (owed or threads < self._pool.threads)
                if short and end - at >= 2 * HANDOVER_PIECE:
                    todo.appendleft((at + HANDOVER_PIECE, end, None))
                    end = at + HANDOVER_PIECE
                ctx.read_rows(True)  # each piece's rows on their own: a given-up piece's are dropped
                ctx.fill([(token, position + i, (0,), False) for i, token in enumerate(self.tokens[at:end])])
                if owed:
                    ctx.decode(more_rows=True)
                elif not ctx.decode_unless_wanted(functools.partial(self._wanted, threads)):
                    # a request waits for this context: the piece is given up, its cells dropped
                    if self._pool.someone_waits(current().lane):
                        return at, position
                    todo.appendleft((at, end, None))  # a request took the side context: again, with fewer threads
                    continue
                position += end - at
            if ctx.tap is not None:
                rows.append(ctx.tap.rows(end - at))
        return len(self.tokens), position

    def _wanted(self, threads: int) -> bool:
        """Whether a piece decoding with `threads` threads is to be given up: a request waits for its
        context, or one is answered on the side context with some of those threads."""
        return self._pool.someone_waits(current().lane) or self._pool.prefill_threads() < threads

    @staticmethod
    def _from(pieces: list[Piece], first: int) -> list[Piece]:
        """The pieces still to decode from cell `first`, which a short owed piece may have left inside a
        text piece: the rest of that piece comes first."""
        return [(max(at, first), end, span) for at, end, span in pieces if end > first]

    def pieces(self, base: Snapshot | None) -> list[Piece]:
        """What the prefill decodes after `base`, one llama_decode each, in order."""
        pieces: list[Piece] = []
        cell = base.n_tokens if base is not None else 0

        def text(upto: int) -> None:
            pieces.extend((at, min(at + self._n_ubatch, upto), None) for at in range(cell, upto, self._n_ubatch))

        for span in self.spans[len(base.spans) if base is not None else 0 :]:
            text(span.offset)
            pieces.append((span.offset, span.offset + span.n_tokens, span))
            cell = span.offset + span.n_tokens
        text(len(self.tokens))
        return pieces

    def _decode_image(self, ctx: Context, span: ImageSpan, position: int) -> int:
        """Encode the image of `span` and decode it into sequence 0 from `position`; the position after."""
        if self._vision is None:
            raise EngineError("this model has no vision projector: it takes no images")
        if span.sha256 not in self.images:
            raise ValueError(f"no file given for the image {span.sha256}")
        n_tokens, after = self._vision.decode(ctx.ctx, self.images[span.sha256], span.sha256, position)
        if (n_tokens, after - position) != (span.n_tokens, span.n_pos):
            raise EngineError(
                f"the image {span.sha256} filled {n_tokens} cells and {after - position} positions, "
                f"not its span's {span.n_tokens} and {span.n_pos}"
            )
        return after


def _saved(ctx: Context, position: int) -> bytes:
    """Sequence 0's bytes, once it holds nothing at or past `position`, where the pieces done end: a
    snapshot of a prefix must not carry cells of what follows it, or every prefill and answer resumed
    from it would decode on top of them."""
    if ctx.last_position() >= position:
        raise EngineError(f"sequence 0 reaches position {ctx.last_position()}, past the prefix's end ({position})")
    return ctx.save()


def _ms_since(began: float) -> float:
    return (time.perf_counter() - began) * 1000
