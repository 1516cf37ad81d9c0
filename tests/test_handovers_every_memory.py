"""Every way a prefill hands its context over ends bit for bit like a prefill nobody interrupted, on every
kind of memory llama.cpp has that a prefill fills: a KV cache (the tiny attention model), and the hybrids
whose recurrent state cannot go back (tiny kev: qwen35's linear attention; tiny lfm2-d1: short
convolutions). A KV cache drops a given-up piece's cells, so a request that comes during a piece takes the
context at once; a hybrid's piece under way always ends first, for llama.cpp cannot take it back (the
removal it tries after giving up fails there, leaving the piece half in the memory). On real llama.cpp."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.engine.caller import Caller, Signal, working_for
from app.engine.context import Memory
from app.engine.engine import Engine, SuffixTokens
from app.engine.prefill import Partial, Stopped
from app.engine.snapshot import Prefix, Snapshot
from tests.support.borrowers import Borrower
from tests.support.prefill_decodes import Decodes, request_during_prefill
from tests.support.tiny_decision import BUILDERS
from tests.support.waiting import until

WAIT_S = 30  # every wait here is bounded; a healthy run takes milliseconds
MEMORIES = ("attention", "kev", "lfm2-d1")
HYBRIDS = ("kev", "lfm2-d1")


@pytest.fixture(scope="module")
def model_paths(tiny_chat_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("memories")
    made = {kind: BUILDERS[kind](folder / f"{kind}.gguf") for kind in HYBRIDS}
    return {"attention": tiny_chat_path, **made}


def engine_for(path: Path, **options: Any) -> Engine:
    settings: dict[str, Any] = {"threads": 1, "probe_layer": "middle"} | options
    return Engine(path, n_ctx=2048, **settings)


@pytest.fixture(params=MEMORIES)
def memory(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def engine(model_paths: dict[str, Path], memory: str) -> Iterator[Engine]:
    made = engine_for(model_paths[memory])
    yield made
    made.close()


def long_prefix(engine: Engine, base: Snapshot | None = None) -> Prefix:
    """More than two micro-batches of text after `base`, if any."""
    head = base.tokens if base is not None else tuple(engine.vocab.tokenize("Sys. ", add_bos=True))
    tokens = (*head, *engine.vocab.tokenize(" the parcel came late again." * 70))
    assert len(tokens) - len(head) > 2 * engine.n_ubatch
    return Prefix(tokens)


def assert_same_snapshot(got: Snapshot, want: Snapshot) -> None:
    """The same bytes, and bit for bit the same state mean."""
    assert got.tokens == want.tokens
    assert got.data == want.data
    assert got.state_mean is not None and want.state_mean is not None
    assert got.state_mean.tobytes() == want.state_mean.tobytes()


def test_the_memory_probe_tells_a_kv_cache_from_a_state_that_cannot_go_back(
    model_paths: dict[str, Path], tmp_path: Path
) -> None:
    memories = {"attention": Memory.DROPS_TAIL, "kev": Memory.FORWARD_ONLY, "lfm2-d1": Memory.FORWARD_ONLY}
    for kind, want in memories.items():
        made = engine_for(model_paths[kind])
        try:
            assert made.memory is want, kind
            assert made._pool.can_give_up is (want is Memory.DROPS_TAIL), kind
        finally:
            made.close()
    laya = engine_for(BUILDERS["laya"](tmp_path / "laya.gguf"), probe_layer=None)
    try:
        assert laya.memory is Memory.NONE and laya.memoryless
    finally:
        laya.close()


@pytest.mark.parametrize("piece", [1, 2])
def test_a_request_that_comes_during_a_piece_gets_the_context_and_the_prefill_ends_alike(
    engine: Engine, memory: str, piece: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KV cache gives the piece under way up for the request; a hybrid ends it first. Either way the
    request has the context before the prefill ends, and the prefill's snapshot is that of one alone."""
    prefix = long_prefix(engine)
    alone, _ = engine.prefill(prefix)
    handed = request_during_prefill(engine, prefix, monkeypatch, piece)
    if memory == "attention":
        assert handed.when_lent == [0] * (piece - 1) + [2]  # the piece under way given up
    else:
        assert handed.when_lent == [0] * piece  # the piece under way ended: never given up
    statuses = handed.decodes.statuses
    assert set(statuses) <= {0, 2} and statuses.count(2) == handed.when_lent.count(2)
    assert_same_snapshot(handed.snapshot, alone)


def test_a_request_that_comes_between_two_pieces_gets_the_context_and_the_prefill_ends_alike(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = long_prefix(engine)
    alone, _ = engine.prefill(prefix)
    handed = request_during_prefill(engine, prefix, monkeypatch, 1, after=True)
    assert handed.when_lent == [0]  # handed over before the second piece began
    assert 2 not in handed.decodes.statuses
    assert_same_snapshot(handed.snapshot, alone)


def test_a_prefill_whose_client_leaves_after_a_handover_is_gone_on_from_by_its_retry_alike(
    engine: Engine, memory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request comes during the second piece; while it holds the context the prefill's client leaves.
    The stopped prefill keeps what it had done, no cell past it, and its retry goes on from there into the
    snapshot of a prefill alone."""
    base, _ = engine.prefill(Prefix(tuple(engine.vocab.tokenize("System part. ", add_bos=True))))
    prefix = long_prefix(engine, base)
    alone, _ = engine.prefill(prefix, base)
    client = Caller("interactive", Signal())
    request: list[Borrower] = []

    def a_request_comes_during_the_second_piece(call: int) -> None:
        if call == 2:
            request.append(Borrower(engine))
            until(lambda: engine._pool.waiting("interactive") == 1, WAIT_S)

    decodes = Decodes(monkeypatch, a_request_comes_during_the_second_piece)

    def prefill_for_the_client() -> Snapshot:
        with working_for(client):
            return engine.prefill(prefix, base)[0]

    thread, ended = decodes.run(prefill_for_the_client)
    until(lambda: bool(request), WAIT_S)
    assert request[0].got.wait(WAIT_S)
    client.stop.set()  # the client leaves while the request holds the context
    request[0].let_go()
    thread.join(WAIT_S)
    assert not thread.is_alive() and isinstance(ended[0], Stopped)
    partial = ended[0].partial
    assert isinstance(partial, Partial)
    done_pieces = 1 if memory == "attention" else 2  # a hybrid's second piece ended before the handover
    assert partial.snapshot.n_tokens == base.n_tokens + done_pieces * engine.n_ubatch
    monkeypatch.undo()
    again, _ = engine.prefill(prefix, base, resume=partial)
    assert_same_snapshot(again, alone)


def test_requests_that_keep_coming_take_turns_with_a_prefill_which_still_ends_alike(
    engine: Engine, memory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request comes as every piece of the prefill starts: the prefill still goes on by a piece each
    time it has the context back, short where pieces can be given up, whole on a hybrid."""
    prefix = long_prefix(engine)
    alone, _ = engine.prefill(prefix)
    requests: list[Borrower] = []
    requests_at_most = 100  # then they stop coming: a prefill they starved would end only then

    def a_request_comes_at_every_piece(call: int) -> None:
        if call < requests_at_most:
            requests.append(Borrower(engine))
            until(lambda: engine._pool.waiting("interactive") == 1, WAIT_S)
            requests[-1].go.set()  # it goes as soon as it has the context

    decodes = Decodes(monkeypatch, a_request_comes_at_every_piece)
    thread, ended = decodes.run(lambda: engine.prefill(prefix)[0])
    thread.join(WAIT_S)
    assert not thread.is_alive()
    for request in requests:
        request.let_go()
    assert len(decodes.statuses) < requests_at_most
    if memory != "attention":
        assert 2 not in decodes.statuses
    assert_same_snapshot(ended[0], alone)


def test_a_request_on_the_side_context_during_a_piece_leaves_the_prefill_alike(
    model_paths: dict[str, Path], memory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads and the side context: a request that comes during the second piece is lent the side
    context at once; a KV cache's piece is given up and goes on with the prefill's share of the threads
    (in short pieces while the request decodes), a hybrid's piece ends with all of them and the next are
    whole. The snapshot is that of a prefill alone, and the request's answer there is the one read on a
    context of its own."""
    engine = engine_for(model_paths[memory], threads=2, answer_during_prefill=True)
    try:
        prefix = long_prefix(engine)
        alone, _ = engine.prefill(prefix)
        question = SuffixTokens(tuple(engine.vocab.tokenize(" Late? Answer:")), (engine.vocab.tokenize(" yes")[0],))
        state, _ = engine.prefill(Prefix(tuple(engine.vocab.tokenize("A short state.", add_bos=True))))
        want = engine.decode_suffixes(state, [question]).readouts[0].label_logits
        answered: list[list[float]] = []

        def answer() -> None:
            answered.append(engine.decode_suffixes(state, [question]).readouts[0].label_logits)

        answering = threading.Thread(target=answer, daemon=True)

        def a_request_comes_during_the_second_piece(call: int) -> None:
            if call == 2:
                answering.start()
                until(lambda: engine._pool._side_lent or bool(answered), WAIT_S)

        decodes = Decodes(monkeypatch, a_request_comes_during_the_second_piece)
        thread, ended = decodes.run(lambda: engine.prefill(prefix)[0])
        thread.join(WAIT_S)
        answering.join(WAIT_S)
        assert not thread.is_alive() and not answering.is_alive()
        assert answered == [want]
        if memory == "attention":
            assert decodes.statuses[1] == 2  # given up, to go on with the prefill's share of the threads
        else:
            assert 2 not in decodes.statuses and set(decodes.sizes[:-1]) == {engine.n_ubatch}
        assert_same_snapshot(ended[0], alone)
    finally:
        engine.close()


def test_a_context_asked_for_an_earlier_snapshot_than_it_holds_answers_as_a_fresh_one(
    model_paths: dict[str, Path], memory: str
) -> None:
    """A context holds a base and the state prefilled on it; asked for the base, a KV cache drops the
    state's cells, a hybrid restores the base: the answer is the one a fresh engine reads."""
    question = None
    answers = []
    for fresh in (True, False):
        engine = engine_for(model_paths[memory])
        try:
            question = SuffixTokens(tuple(engine.vocab.tokenize(" Late? Answer:")), (engine.vocab.tokenize(" yes")[0],))
            base, _ = engine.prefill(Prefix(tuple(engine.vocab.tokenize("System part. ", add_bos=True))))
            if not fresh:
                state, _ = engine.prefill(long_prefix(engine, base), base)
                engine.decode_suffixes(state, [question])  # the context holds base, then state
            answers.append(engine.decode_suffixes(base, [question]).readouts[0].label_logits)
            answers.append(engine.decode_suffixes(base, [question]).readouts[0].label_logits)  # held: no restore
        finally:
            engine.close()
    assert question is not None
    assert answers[0] == answers[1] == answers[2] == answers[3]
