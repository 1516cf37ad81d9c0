"""The engine's contexts are lent by lane and never for nobody: interactive work is lent an idle context
before background work, background work holds at most half the pool, a borrower whose work is stopped
leaves its wait, and a prefill stops between its pieces once nobody waits for it, leaving nothing that
changes a later answer. On real llama.cpp with the tiny model."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.engine import bindings
from app.engine.caller import Caller, Lane, Signal, working_for
from app.engine.engine import Engine
from app.engine.prefill import Stopped
from app.engine.snapshot import Prefix, Snapshot
from app.errors import Cancelled
from tests.support.borrowers import Borrower
from tests.support.llama_calls import count_llama_calls
from tests.support.waiting import until

WAIT_S = 30  # every wait here is bounded; a healthy run takes milliseconds


@pytest.fixture
def engine(tiny_chat_path: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    contexts = getattr(request, "param", 1)
    made = Engine(tiny_chat_path, n_ctx=2048, threads=1, contexts=contexts)
    yield made
    made.close()


def assert_same_snapshot(got: Snapshot, want: Snapshot) -> None:
    """The same bytes, and bit for bit the same state mean."""
    assert got.data == want.data
    assert got.state_mean is not None and want.state_mean is not None
    assert got.state_mean.tobytes() == want.state_mean.tobytes()


def waiting(engine: Engine, lane: Lane, count: int) -> Callable[[], bool]:
    return lambda: engine._pool.waiting(lane) == count


def test_a_stopped_borrower_leaves_its_wait_without_taking_a_context(engine: Engine) -> None:
    lent: list[str] = []
    holder = Borrower(engine, Caller(), lent, "holder")
    assert holder.got.wait(WAIT_S)
    stopped = Caller("interactive", Signal())
    waiter = Borrower(engine, stopped, lent, "waiter")
    until(waiting(engine, "interactive", 1), WAIT_S)
    stopped.stop.set()  # its client went away
    waiter.thread.join(WAIT_S)
    assert isinstance(waiter.error, Cancelled)
    assert engine._pool.lent("interactive") == 1 and engine._pool.waiting("interactive") == 0
    holder.let_go()
    assert lent == ["holder"] and engine._pool.lent("interactive") == 0


def test_interactive_work_is_lent_a_free_context_before_background_work(engine: Engine) -> None:
    lent: list[str] = []
    holder = Borrower(engine, Caller(), lent, "holder")
    assert holder.got.wait(WAIT_S)
    fit = Borrower(engine, Caller("background"), lent, "fit")
    until(waiting(engine, "background", 1), WAIT_S)
    request = Borrower(engine, Caller(), lent, "request")  # came after the fit's step
    until(waiting(engine, "interactive", 1), WAIT_S)
    holder.let_go()
    assert request.got.wait(WAIT_S)
    assert not fit.got.is_set()
    request.let_go()
    assert fit.got.wait(WAIT_S)
    fit.let_go()
    assert lent == ["holder", "request", "fit"]


def test_a_promoted_background_borrower_is_lent_before_the_background_work_ahead_of_it(engine: Engine) -> None:
    """A fit's prefill that an interactive request came to wait for (the RAM tier's single flight) is
    promoted while it waits for a context: it goes before the fit's other step that came first."""
    lent: list[str] = []
    holder = Borrower(engine, Caller(), lent, "holder")
    assert holder.got.wait(WAIT_S)
    fit = Borrower(engine, Caller("background"), lent, "fit")
    until(waiting(engine, "background", 1), WAIT_S)
    awaited = Caller("background")
    prefill = Borrower(engine, awaited, lent, "awaited prefill", prefill=True)
    until(waiting(engine, "background", 2), WAIT_S)
    awaited.promote()  # a request waits for it now
    until(waiting(engine, "interactive", 1), WAIT_S)
    holder.let_go()
    assert prefill.got.wait(WAIT_S)
    assert not fit.got.is_set()
    prefill.let_go()
    assert fit.got.wait(WAIT_S)
    fit.let_go()
    assert lent == ["holder", "awaited prefill", "fit"]


@pytest.mark.parametrize("engine", [2], indirect=True)
def test_background_work_holds_at_most_half_the_contexts(engine: Engine) -> None:
    lent: list[str] = []
    first = Borrower(engine, Caller("background"), lent, "fit 1")
    assert first.got.wait(WAIT_S)
    second = Borrower(engine, Caller("background"), lent, "fit 2")
    until(waiting(engine, "background", 1), WAIT_S)  # a context is idle, but it stays the interactive lane's
    request = Borrower(engine, Caller(), lent, "request")
    assert request.got.wait(WAIT_S)
    assert not second.got.is_set()
    first.let_go()
    assert second.got.wait(WAIT_S)
    second.let_go()
    request.let_go()
    assert lent == ["fit 1", "request", "fit 2"]


def test_a_prefill_stops_between_its_pieces_and_leaves_nothing_that_changes_an_answer(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = engine.vocab.tokenize("the parcel came late again. " * 60, add_bos=True)
    pieces = -(-len(tokens) // engine.n_ubatch)
    assert pieces >= 3
    whole, _ = engine.prefill(Prefix(tuple(tokens)))  # nobody stops it
    calls = count_llama_calls(monkeypatch)
    bindings.init()
    import llama_cpp

    decode = llama_cpp.llama_decode
    stopped = Caller("interactive", Signal())

    def client_leaves_during_the_first_piece(ctx: Any, batch: Any) -> Any:
        stopped.stop.set()
        return decode(ctx, batch)

    monkeypatch.setattr(llama_cpp, "llama_decode", client_leaves_during_the_first_piece)
    with working_for(stopped), pytest.raises(Cancelled):
        engine.prefill(Prefix(tuple(tokens)))
    assert calls.decodes == 1 and calls.rows == engine.n_ubatch  # one piece, not the other pieces
    monkeypatch.setattr(llama_cpp, "llama_decode", decode)
    again, _ = engine.prefill(Prefix(tuple(tokens)))  # on the context the stopped prefill used
    assert again.data == whole.data


def test_a_retry_goes_on_from_the_pieces_a_stopped_prefill_paid_for_and_ends_alike(
    tiny_chat_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that gives up and retries (the SDK does): the stopped prefill says what it had done, and
    the retry decodes only the rest, into the snapshot and state mean of an uninterrupted prefill."""
    engine = Engine(tiny_chat_path, n_ctx=2048, threads=1, probe_layer="middle")
    try:
        base, _ = engine.prefill(Prefix(tuple(engine.vocab.tokenize("System part. ", add_bos=True))))
        tokens = (*base.tokens, *engine.vocab.tokenize(" the parcel came late again." * 60))
        whole, _ = engine.prefill(Prefix(tokens), base)
        assert whole.state_mean is not None
        calls = count_llama_calls(monkeypatch)
        bindings.init()
        import llama_cpp

        decode, stopped = llama_cpp.llama_decode, Caller("interactive", Signal())

        def client_leaves_during_the_second_piece(ctx: Any, batch: Any) -> Any:
            if calls.decodes == 1:
                stopped.stop.set()
            return decode(ctx, batch)

        monkeypatch.setattr(llama_cpp, "llama_decode", client_leaves_during_the_second_piece)
        with working_for(stopped), pytest.raises(Stopped) as raised:
            engine.prefill(Prefix(tokens), base)
        partial = raised.value.partial
        assert partial is not None and partial.snapshot.n_tokens == base.n_tokens + 2 * engine.n_ubatch
        monkeypatch.setattr(llama_cpp, "llama_decode", decode)
        rows_before = calls.rows
        again, _ = engine.prefill(Prefix(tokens), base, resume=partial)
        assert calls.rows - rows_before == len(tokens) - partial.snapshot.n_tokens  # only the rest
        assert_same_snapshot(again, whole)
        other_base, _ = engine.prefill(Prefix(base.tokens[:-1]))
        rows_before = calls.rows
        engine.prefill(Prefix(tokens), other_base, resume=partial)  # begun after another base: not gone on from
        assert calls.rows - rows_before == len(tokens) - other_base.n_tokens
    finally:
        engine.close()


def test_a_prefill_in_pieces_is_the_one_call_llama_cpp_would_split_alike(engine: Engine) -> None:
    tokens = engine.vocab.tokenize("where is my order? " * 80, add_bos=True)
    assert len(tokens) > 2 * engine.n_ubatch
    pieces, _ = engine.prefill(Prefix(tuple(tokens)))
    with engine._pool.borrow(None) as ctx:
        ctx.clear()
        ctx.fill([(token, i, (0,), False) for i, token in enumerate(tokens)])
        ctx.decode()
        one_call = ctx.save()
        ctx.clear()
    assert pieces.data == one_call


def test_a_context_keeps_no_snapshot_alive_that_the_cache_let_go(engine: Engine) -> None:
    """A pooled context remembers which snapshot its cells hold, but a snapshot the RAM tier evicted is
    freed all the same: its bytes are counted in no budget any more."""
    first, _ = engine.prefill(Prefix(tuple(engine.vocab.tokenize("the first state", add_bos=True))))
    kept = weakref.ref(first)
    with engine._pool.borrow(first) as ctx:
        assert ctx.position_of(first) == 0  # the context holds it: a request for it skips the restore
    del first
    gc.collect()
    assert kept() is None


def test_a_long_prefill_hands_its_context_to_a_waiting_request_between_pieces_and_ends_alike(
    tiny_chat_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One context: a request that comes while a long state is prefilled gets the context after the
    piece under way, not after the whole state; the prefill then goes on from a snapshot of what it
    had done, and its snapshot and state mean are those of a prefill nobody interrupted, bit for bit."""
    engine = Engine(tiny_chat_path, n_ctx=2048, threads=1, probe_layer="middle")
    try:
        tokens = engine.vocab.tokenize("the parcel came late again. " * 60, add_bos=True)
        assert len(tokens) > 2 * engine.n_ubatch
        alone, _ = engine.prefill(Prefix(tuple(tokens)))
        assert alone.state_mean is not None
        bindings.init()
        import llama_cpp

        decode, events = llama_cpp.llama_decode, []
        lent: list[str] = []
        request: list[Borrower] = []
        came = threading.Event()

        def a_request_comes_during_the_first_piece(ctx: Any, batch: Any) -> Any:
            events.append("piece")
            if not request:
                request.append(Borrower(engine, Caller(), lent, "request"))
                until(waiting(engine, "interactive", 1), WAIT_S)
                came.set()
            return decode(ctx, batch)

        monkeypatch.setattr(llama_cpp, "llama_decode", a_request_comes_during_the_first_piece)
        handed: list[int] = []
        prefilling = threading.Thread(
            target=lambda: handed.append(len(engine.prefill(Prefix(tuple(tokens)))[0].tokens)), daemon=True
        )
        prefilling.start()
        assert came.wait(WAIT_S) and request[0].got.wait(WAIT_S)
        pieces_before = events.count("piece")
        request[0].let_go()
        prefilling.join(WAIT_S)
        assert not prefilling.is_alive() and handed == [len(tokens)]
        assert pieces_before == 1  # the request waited for one piece, not for the state
        monkeypatch.setattr(llama_cpp, "llama_decode", decode)
        again, _ = engine.prefill(Prefix(tuple(tokens)))
        assert_same_snapshot(again, alone)
    finally:
        engine.close()


def test_a_request_that_comes_during_a_piece_takes_the_context_from_it_and_the_prefill_ends_alike(
    tiny_chat_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One context: a request that comes while a piece of a long state is decoded does not wait for that
    piece: llama.cpp gives the piece up, the request goes first, and the prefill decodes the piece
    again, into the snapshot and state mean of a prefill nobody interrupted, bit for bit."""
    engine = Engine(tiny_chat_path, n_ctx=2048, threads=1, probe_layer="middle")
    try:
        tokens = engine.vocab.tokenize("the parcel came late again. " * 60, add_bos=True)
        assert len(tokens) > 2 * engine.n_ubatch
        alone, _ = engine.prefill(Prefix(tuple(tokens)))
        assert alone.state_mean is not None
        bindings.init()
        import llama_cpp

        decode, statuses = llama_cpp.llama_decode, list[int]()
        lent: list[str] = []
        request: list[Borrower] = []

        def a_request_comes_as_the_first_piece_starts(ctx: Any, batch: Any) -> Any:
            if not request:
                request.append(Borrower(engine, Caller(), lent, "request"))
                until(waiting(engine, "interactive", 1), WAIT_S)
            statuses.append(decode(ctx, batch))
            return statuses[-1]

        monkeypatch.setattr(llama_cpp, "llama_decode", a_request_comes_as_the_first_piece_starts)
        handed: list[int] = []
        prefilling = threading.Thread(
            target=lambda: handed.append(len(engine.prefill(Prefix(tuple(tokens)))[0].tokens)), daemon=True
        )
        prefilling.start()
        until(lambda: bool(request), WAIT_S)
        assert request[0].got.wait(WAIT_S)
        assert statuses == [2]  # the piece under way was given up, not finished, before the request went
        request[0].let_go()
        prefilling.join(WAIT_S)
        assert not prefilling.is_alive() and handed == [len(tokens)]
        assert set(statuses[1:]) == {0}  # then every piece done, the given-up one again among them
        monkeypatch.setattr(llama_cpp, "llama_decode", decode)
        again, _ = engine.prefill(Prefix(tuple(tokens)))
        assert_same_snapshot(again, alone)
    finally:
        engine.close()


def test_requests_that_keep_coming_take_turns_with_a_prefill_which_still_ends_alike(
    tiny_chat_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request comes at every piece the prefill starts: each one takes the context, yet the prefill goes
    on by a short piece each time it gets the context back, so it ends, with the bytes of a prefill
    nobody interrupted."""
    engine = Engine(tiny_chat_path, n_ctx=2048, threads=1, probe_layer="middle")
    try:
        tokens = engine.vocab.tokenize("the parcel came late again. " * 60, add_bos=True)
        alone, _ = engine.prefill(Prefix(tuple(tokens)))
        bindings.init()
        import llama_cpp

        decode, statuses = llama_cpp.llama_decode, list[int]()
        lent: list[str] = []
        requests_at_most = 100  # then they stop coming: a prefill they starved would end only then
        prefill_thread: list[threading.Thread] = []
        requests: list[Borrower] = []

        def a_request_comes_at_every_piece(ctx: Any, batch: Any) -> Any:
            if threading.current_thread() in prefill_thread and len(statuses) < requests_at_most:
                requests.append(Borrower(engine, Caller(), lent, "request"))
                until(waiting(engine, "interactive", 1), WAIT_S)
                requests[-1].go.set()  # it goes as soon as it has the context
            statuses.append(decode(ctx, batch))
            return statuses[-1]

        monkeypatch.setattr(llama_cpp, "llama_decode", a_request_comes_at_every_piece)
        handed: list[Any] = []
        prefilling = threading.Thread(
            target=lambda: handed.append(engine.prefill(Prefix(tuple(tokens)))[0]), daemon=True
        )
        prefill_thread.append(prefilling)
        prefilling.start()
        prefilling.join(WAIT_S)
        assert not prefilling.is_alive() and len(handed) == 1
        for request in requests:
            request.let_go()
        # every piece it started let a request go first, yet it ended long before requests stopped coming
        assert len(lent) == len(statuses) < requests_at_most
        assert_same_snapshot(handed[0], alone)
    finally:
        engine.close()


class PrefillThreads:
    """Prefills on threads of their own, with llama_decode watched on each: `before(name, call)` as each
    of a prefill's decodes starts (`call` counts from 1), and every status, per prefill."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, before: Callable[[str, int], None]) -> None:
        bindings.init()
        import llama_cpp

        decode = llama_cpp.llama_decode
        self.statuses: dict[str, list[int]] = {}
        self.results: dict[str, Any] = {}
        self._names: dict[threading.Thread, str] = {}
        self._threads: list[threading.Thread] = []

        def watched(ctx: Any, batch: Any) -> Any:
            name = self._names.get(threading.current_thread())
            if name is None:
                return decode(ctx, batch)
            before(name, len(self.statuses[name]) + 1)
            self.statuses[name].append(decode(ctx, batch))
            return self.statuses[name][-1]

        monkeypatch.setattr(llama_cpp, "llama_decode", watched)

    def start(self, name: str, engine: Engine, prefix: Prefix, caller: Caller | None = None) -> None:
        def run() -> None:
            with working_for(caller or Caller()):
                self.results[name] = engine.prefill(prefix)[0]

        thread = threading.Thread(target=run, daemon=True)
        self.statuses[name] = []
        self._names[thread] = name
        self._threads.append(thread)
        thread.start()

    def join(self) -> None:
        for thread in self._threads:
            thread.join(WAIT_S)
            assert not thread.is_alive()


def two_long_prefixes(engine: Engine) -> tuple[Prefix, Prefix]:
    made = tuple(
        Prefix(tuple(engine.vocab.tokenize(opening + " the parcel came late again." * 60, add_bos=True)))
        for opening in ("First.", "Second.")
    )
    assert all(len(prefix.tokens) > 2 * engine.n_ubatch for prefix in made)
    return made[0], made[1]


def test_a_prefill_keeps_its_context_when_another_prefill_of_its_lane_comes(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two new states on one context: the second waits for the first's prefill, which neither gives up
    its piece nor hands over, instead of both taking turns with a snapshot saved and restored at each."""
    first, second = two_long_prefixes(engine)
    alone = [engine.prefill(prefix)[0] for prefix in (first, second)]

    def the_second_comes_during_the_first_ones_second_piece(name: str, call: int) -> None:
        if name == "first" and call == 2:
            prefills.start("second", engine, second)
            until(waiting(engine, "interactive", 1), WAIT_S)

    prefills = PrefillThreads(monkeypatch, the_second_comes_during_the_first_ones_second_piece)
    prefills.start("first", engine, first)
    prefills.join()
    pieces = -(-len(first.tokens) // engine.n_ubatch)
    assert prefills.statuses["first"] == [0] * pieces  # every piece once, none given up
    assert set(prefills.statuses["second"]) == {0}
    assert prefills.results["first"].data == alone[0].data
    assert prefills.results["second"].data == alone[1].data


def test_a_background_prefill_hands_its_context_to_an_interactive_prefill(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fit's prefill gives its piece up for a request's new state, which then runs whole before it."""
    first, second = two_long_prefixes(engine)
    alone = [engine.prefill(prefix)[0] for prefix in (first, second)]
    order: list[str] = []

    def a_request_comes_during_the_fits_second_piece(name: str, call: int) -> None:
        order.append(name)
        if name == "fit" and call == 2:
            prefills.start("request", engine, second)
            until(waiting(engine, "interactive", 1), WAIT_S)

    prefills = PrefillThreads(monkeypatch, a_request_comes_during_the_fits_second_piece)
    prefills.start("fit", engine, first, Caller("background", Signal()))
    prefills.join()
    assert prefills.statuses["fit"][:2] == [0, 2]  # its second piece given up for the request
    request_pieces = -(-len(second.tokens) // engine.n_ubatch)
    assert order[2 : 2 + request_pieces] == ["request"] * request_pieces  # the request's prefill ran whole
    assert prefills.results["fit"].data == alone[0].data
    assert prefills.results["request"].data == alone[1].data


@pytest.mark.parametrize("engine", [2], indirect=True)
def test_a_request_gives_up_the_piece_of_one_prefill_not_of_every_one(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two contexts, each prefilling a long state: a request that comes needs one context, so one prefill's
    piece is given up for it, and the other goes on."""
    first, second = two_long_prefixes(engine)
    alone = [engine.prefill(prefix)[0] for prefix in (first, second)]
    both_at_their_second_piece = threading.Barrier(3, timeout=WAIT_S)
    request: list[Borrower] = []

    def both_wait_for_the_request(name: str, call: int) -> None:
        if call == 2:
            both_at_their_second_piece.wait()  # the request comes ...
            both_at_their_second_piece.wait()  # ... while both are armed to be given up

    prefills = PrefillThreads(monkeypatch, both_wait_for_the_request)
    prefills.start("first", engine, first)
    prefills.start("second", engine, second)
    both_at_their_second_piece.wait()
    request.append(Borrower(engine, Caller(), None, "request"))
    until(waiting(engine, "interactive", 1), WAIT_S)
    both_at_their_second_piece.wait()
    assert request[0].got.wait(WAIT_S)
    request[0].let_go()
    prefills.join()
    assert sorted(prefills.statuses[name][1] for name in ("first", "second")) == [0, 2]
    assert prefills.results["first"].data == alone[0].data
    assert prefills.results["second"].data == alone[1].data
