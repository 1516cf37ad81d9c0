"""The side context (the setting answer_during_prefill): a request that comes while a prefill holds the
pool's context is answered on the side context with most of the threads, while the prefill keeps its
context and cells and goes on with its share, then all its threads again. Nothing changes a byte: the
prefill ends with the snapshot of a prefill nobody shared the cores with, and an answer read on the side
context is the one read on the pool's. On real llama.cpp with the tiny model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.engine import bindings
from app.engine.engine import Engine, SuffixTokens
from app.engine.kv_settings import HANDOVER_PIECE
from app.engine.lending import prefill_share
from app.engine.snapshot import Prefix
from tests.support.borrowers import Borrower
from tests.support.waiting import until

WAIT_S = 30  # every wait here is bounded; a healthy run takes milliseconds
THREADS = 2


@pytest.fixture
def engine(tiny_chat_path: Path) -> Iterator[Engine]:
    made = Engine(tiny_chat_path, n_ctx=2048, threads=THREADS, probe_layer="middle", answer_during_prefill=True)
    yield made
    made.close()


def long_prefix(engine: Engine) -> Prefix:
    tokens = engine.vocab.tokenize("the parcel came late again. " * 60, add_bos=True)
    assert len(tokens) > 2 * engine.n_ubatch
    return Prefix(tuple(tokens))


def test_a_request_during_a_prefill_is_answered_beside_it_and_the_prefill_ends_alike(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request comes as the prefill's first piece starts: that piece, decoding with all the threads, is
    given up; the request gets the side context at once while the prefill keeps its own, whose next
    pieces are short and use the prefill's share of the threads; once the request is done, the prefill's
    pieces are whole and use all the threads again. Its snapshot is that of a prefill alone, bit for bit."""
    prefix = long_prefix(engine)
    alone, _ = engine.prefill(prefix)
    bindings.init()
    import llama_cpp

    decode = llama_cpp.llama_decode
    pieces: list[tuple[int, int, int]] = []  # (threads, tokens, status) of each prefill piece
    request: list[Borrower] = []
    shared_pieces = 2  # the request lets go after the prefill has decoded this many pieces beside it

    def a_request_comes_as_the_first_piece_starts(ctx: Any, batch: Any) -> Any:
        if not request:
            request.append(Borrower(engine))
            assert request[0].got.wait(WAIT_S)  # the side context: the prefill's is not handed over
        threads = llama_cpp.llama_n_threads(ctx)
        status = decode(ctx, batch)
        pieces.append((threads, batch.n_tokens, status))
        if sum(1 for piece in pieces if piece[2] == 0) == shared_pieces:
            request[0].let_go()
        return status

    monkeypatch.setattr(llama_cpp, "llama_decode", a_request_comes_as_the_first_piece_starts)
    done, _ = engine.prefill(prefix)
    monkeypatch.setattr(llama_cpp, "llama_decode", decode)

    assert request[0].ctx is engine._pool._side
    share = prefill_share(THREADS)
    assert pieces[0] == (THREADS, engine.n_ubatch, 2)  # given up for the request
    beside = pieces[1 : 1 + shared_pieces]
    assert beside == [(share, HANDOVER_PIECE, 0)] * shared_pieces
    after = pieces[1 + shared_pieces :]
    assert after and all(threads == THREADS and status == 0 for threads, _, status in after)
    assert max(tokens for _, tokens, _ in after) == engine.n_ubatch
    assert done.data == alone.data
    assert done.state_mean is not None and alone.state_mean is not None
    assert done.state_mean.tobytes() == alone.state_mean.tobytes()


def test_an_answer_on_the_side_context_is_the_answer_on_the_pool_s_context(engine: Engine) -> None:
    """The same question after the same snapshot reads the same label logits on the side context (fewer
    threads, while a prefill holds the pool's context) as on the pool's own context."""
    snapshot, _ = engine.prefill(long_prefix(engine))
    suffixes = question_suffixes(engine)
    on_pool = engine.decode_suffixes(snapshot, suffixes)
    prefill = Borrower(engine, prefill=True)
    assert prefill.got.wait(WAIT_S)
    try:
        on_side = engine.decode_suffixes(snapshot, suffixes)
        assert engine._pool._side is not None and engine._pool._side.threads == THREADS - prefill_share(THREADS)
    finally:
        prefill.let_go()
    assert [r.label_logits for r in on_side.readouts] == [r.label_logits for r in on_pool.readouts]


def test_the_side_context_is_only_lent_to_a_request_beside_a_prefill(engine: Engine) -> None:
    """While a request (not a prefill) holds the pool's context, another request waits for it rather than
    take the side context, whose cores the first one uses; and a prefill never takes the side context."""
    first = Borrower(engine)
    assert first.got.wait(WAIT_S)
    second = Borrower(engine)
    prefill = Borrower(engine, prefill=True)
    until(lambda: engine._pool.waiting("interactive") == 2, WAIT_S)
    assert not second.got.is_set() and not prefill.got.is_set()  # both queued: each looked, and waits
    first.let_go()
    assert second.got.wait(WAIT_S) and second.ctx is first.ctx
    second.let_go()
    assert prefill.got.wait(WAIT_S) and prefill.ctx is first.ctx
    prefill.let_go()


def test_a_context_lent_while_the_side_context_is_decodes_with_the_share_of_the_threads(engine: Engine) -> None:
    """A request that gets the pool's context while another is answered on the side context (the prefill
    beside which it was lent has just ended) decodes with the prefill's share, not with every thread; the
    next one, the side context handed back, with every thread again."""
    prefill = Borrower(engine, prefill=True)
    assert prefill.got.wait(WAIT_S)
    on_side = Borrower(engine)
    assert on_side.got.wait(WAIT_S) and on_side.ctx is engine._pool._side
    prefill.let_go()
    beside = Borrower(engine)
    assert beside.got.wait(WAIT_S) and beside.ctx is prefill.ctx
    assert beside.ctx is not None and beside.ctx.threads == prefill_share(THREADS)
    beside.let_go()
    on_side.let_go()
    after = Borrower(engine)
    assert after.got.wait(WAIT_S) and after.ctx is prefill.ctx
    assert after.ctx is not None and after.ctx.threads == THREADS
    after.let_go()


def test_one_thread_has_no_side_context(tiny_chat_path: Path) -> None:
    made = Engine(tiny_chat_path, n_ctx=2048, threads=1, answer_during_prefill=True)
    try:
        assert not made.side_context and made._pool._side is None
    finally:
        made.close()


def question_suffixes(engine: Engine) -> list[SuffixTokens]:
    yes, no = (engine.vocab.tokenize(word, add_bos=False)[0] for word in (" yes", " no"))
    return [
        SuffixTokens(tuple(engine.vocab.tokenize(text, add_bos=False)), (yes, no))
        for text in (" Was it late? Answer:", " Did it come? Answer:")
    ]
