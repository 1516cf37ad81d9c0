"""With `batch_requests`, the question decodes of requests that wait at once share one llama_decode: each
request gets its own readouts, a request alone stays bit-identical to the setting off, one beside others
says so and moves by float rounding only, and a request whose client left is not decoded for nobody. On
real llama.cpp with the tiny model; the default model's spread is tests/test_real_model.py's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from app.answering.service import ModelService
from app.engine import lending
from app.engine.caller import Caller, Lane, Signal, working_for
from app.engine.engine import Engine, SuffixReadouts, SuffixTokens
from app.engine.snapshot import Prefix, Snapshot
from app.engine.suffix_tree import suffix_rows
from app.errors import Cancelled
from app.http.server import create_app
from app.serving.registry import ModelRegistry
from app.serving.specs import ModelSpec
from app.wire.contract import SystemOneRequest
from tests.support.loading import load_model
from tests.support.settings import tiny_settings
from tests.support.shared_decodes import context_lent, queued
from tests.support.waiting import until

WAIT_S = 30  # every wait here is bounded; a healthy run takes milliseconds
N_REQUESTS = 4


@pytest.fixture(scope="module")
def engines(tiny_chat_path: Path) -> Iterator[tuple[Engine, Engine]]:
    """The same model with the setting off and on, one context each."""
    alone = Engine(tiny_chat_path, n_ctx=2048, threads=1)
    shared = Engine(tiny_chat_path, n_ctx=2048, threads=1, batch_requests=True)
    yield alone, shared
    alone.close()
    shared.close()


def requests(engine: Engine) -> list[tuple[Snapshot, list[SuffixTokens]]]:
    """Prefixes of different lengths, with one to three questions that share their first tokens."""
    made = []
    for i in range(N_REQUESTS):
        prefix, _ = engine.prefill(Prefix(tuple(1 + (7 * i + j) % 200 for j in range(20 + 13 * i))))
        suffixes = [SuffixTokens([5, 6, 7 + q, 8 + i], labels=[10, 11, 12]) for q in range(1 + i % 3)]
        made.append((prefix, suffixes))
    return made


class Asker:
    """A thread that decodes one request's questions for its own caller."""

    def __init__(
        self,
        engine: Engine,
        prefix: Snapshot,
        suffixes: list[SuffixTokens],
        *,
        beside_others: bool = True,
        lane: Lane = "interactive",
    ) -> None:
        self.caller = Caller(lane, Signal())
        self.found: SuffixReadouts | None = None
        self.error: Exception | None = None
        args = (engine, prefix, suffixes, beside_others)
        self.thread = threading.Thread(target=self._run, args=args, daemon=True)
        self.thread.start()

    def _run(self, engine: Engine, prefix: Snapshot, suffixes: list[SuffixTokens], beside_others: bool) -> None:
        try:
            with working_for(self.caller):
                self.found = engine.decode_suffixes(prefix, suffixes, beside_others=beside_others)
        except Exception as error:  # the test reads it
            self.error = error

    def join(self) -> None:
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive()


def ask_in_line(engine: Engine, asked: list[tuple[Snapshot, list[SuffixTokens]]]) -> list[Asker]:
    """One thread per request, each started once the one before waits for the context: they wait in
    this order, and the first leads."""
    askers = []
    for prefix, suffixes in asked:
        askers.append(Asker(engine, prefix, suffixes))
        until(lambda: queued(engine) == len(askers) == engine._pool.waiting("interactive"), WAIT_S)
    return askers


def logits(found: SuffixReadouts) -> np.ndarray:
    return np.array([r.label_logits for r in found.readouts], dtype=np.float32)


def test_requests_that_wait_at_once_share_one_decode_and_each_gets_its_own_readouts(
    engines: tuple[Engine, Engine],
) -> None:
    alone, shared = engines
    asked = requests(shared)
    expected = [logits(alone.decode_suffixes(*request)) for request in requests(alone)]
    assert shared._shared is not None
    decodes, answered = shared._shared.decodes, shared._shared.requests
    with context_lent(shared, WAIT_S):
        askers = ask_in_line(shared, asked)
    for asker in askers:
        asker.join()
    assert [a.error for a in askers] == [None] * N_REQUESTS
    assert shared._shared.decodes - decodes == 1  # one leader took every request
    assert shared._shared.requests - answered == N_REQUESTS
    for asker, want in zip(askers, expected, strict=True):
        assert asker.found is not None
        assert asker.found.beside == N_REQUESTS - 1
        got = logits(asker.found)
        assert got.shape == want.shape
        # Float rounding only: other cells and rows change the order ggml sums in, never which values.
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    # The requests' own numbers, not one another's: the readouts follow their own prefixes.
    assert len({tuple(logits(a.found).ravel().tolist()) for a in askers if a.found is not None}) == N_REQUESTS


def test_a_request_alone_is_bit_identical_to_the_setting_off(engines: tuple[Engine, Engine]) -> None:
    alone, shared = engines
    for (prefix, suffixes), (own_prefix, _) in zip(requests(alone), requests(shared), strict=True):
        want = alone.decode_suffixes(prefix, suffixes)
        got = shared.decode_suffixes(own_prefix, suffixes, beside_others=True)
        assert got.beside == 0
        assert np.array_equal(logits(got), logits(want))  # bit for bit
        assert [r.label_mass for r in got.readouts] == [r.label_mass for r in want.readouts]


def test_a_measurement_that_is_kept_is_never_decoded_beside_others(engines: tuple[Engine, Engine]) -> None:
    """A prior or a fit's evidence is stored and read again later, by servers with the setting off too:
    it must be the same number whatever else was asked at the time."""
    alone, shared = engines
    asked = requests(shared)
    with context_lent(shared, WAIT_S):
        askers = []
        for prefix, suffixes in asked:
            askers.append(Asker(shared, prefix, suffixes, beside_others=False))
            until(lambda: shared._pool.waiting("interactive") == len(askers), WAIT_S)
        assert queued(shared) == 0
    for asker in askers:
        asker.join()
    for asker, (prefix, suffixes) in zip(askers, requests(alone), strict=True):
        assert asker.found is not None and asker.found.beside == 0
        assert np.array_equal(logits(asker.found), logits(alone.decode_suffixes(prefix, suffixes)))


def test_a_request_whose_client_left_is_not_decoded_and_the_others_are(engines: tuple[Engine, Engine]) -> None:
    _, shared = engines
    asked = requests(shared)
    assert shared._shared is not None
    answered = shared._shared.requests
    with context_lent(shared, WAIT_S):
        askers = ask_in_line(shared, asked)
        gone = askers[1]
        gone.caller.stop.set()  # its client went away while it waited
    for asker in askers:
        asker.join()
    assert isinstance(gone.error, Cancelled)
    assert [a.error for a in askers if a is not gone] == [None] * (N_REQUESTS - 1)
    assert shared._shared.requests - answered == N_REQUESTS - 1
    assert all(a.found is not None and a.found.beside == N_REQUESTS - 2 for a in askers if a is not gone)
    assert queued(shared) == 0


def test_the_first_in_line_leaving_does_not_fail_the_others(engines: tuple[Engine, Engine]) -> None:
    _, shared = engines
    asked = requests(shared)
    with context_lent(shared, WAIT_S):
        askers = ask_in_line(shared, asked)
        first = askers[0]  # it would have led
        first.caller.stop.set()
    for asker in askers:
        asker.join()
    assert isinstance(first.error, Cancelled)
    assert all(a.error is None and a.found is not None for a in askers[1:])


def test_a_leader_whose_client_leaves_as_it_leads_still_answers_its_one_follower(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's client leaves once it has taken the others, before it decodes (during its gather, say):
    the one request left is decoded for its own client, which is still there, as it would be alone."""
    alone, shared = engines
    assert shared._shared is not None
    lead = shared._shared._lead

    def client_leaves_as_it_leads(ctx: Any, taken: list[Any]) -> None:
        taken[0].stop.set()
        lead(ctx, taken)

    monkeypatch.setattr(shared._shared, "_lead", client_leaves_as_it_leads)
    asked = requests(shared)[:2]
    with context_lent(shared, WAIT_S):
        leader, follower = ask_in_line(shared, asked)
    leader.join()
    follower.join()
    assert isinstance(leader.error, Cancelled)
    assert follower.error is None and follower.found is not None
    prefix, suffixes = requests(alone)[1]
    assert np.array_equal(logits(follower.found), logits(alone.decode_suffixes(prefix, suffixes)))  # as alone


def companies_expected(shared: Engine, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Lane, int]]:
    """From here on, the lane and the company of each first question decode in line the scheduler decides
    on, in the order it decides, once each for as long as it is the same."""
    expected: list[tuple[Lane, int]] = []
    waits = lending.waits_for_company
    lasts = shared._pool._last

    def counted(last: lending.LastDecode, queue: Any, max_rows: int, now: float) -> bool:
        seen = (next(lane for lane in lasts if lasts[lane] is last), last.company)
        if not expected or expected[-1] != seen:
            expected.append(seen)
        return waits(last, queue, max_rows, now)

    monkeypatch.setattr(lending, "waits_for_company", counted)
    return expected


def test_a_leader_expects_the_requests_the_last_decode_left_waiting(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request left queued by a decode (it did not fit, or came while the decode ran) goes in the next
    round with the clients that decode answered: the next leader gathers for both, not for the last
    decode's own count only, which would leave one request behind every round."""
    _, shared = engines
    decodes = shared._shared
    assert decodes is not None
    first, second = requests(shared)[:2]
    first_rows, _ = suffix_rows([s.tokens for s in first[1]], first[0].next_pos)
    monkeypatch.setattr(shared._pool, "_max_rows", len(first_rows))  # the first fits, not the second beside it
    expected = companies_expected(shared, monkeypatch)
    before = decodes.decodes
    with context_lent(shared, WAIT_S):
        askers = ask_in_line(shared, [first, second])
        shared._pool._last["interactive"].company = 1  # as after one client alone
    for asker in askers:
        asker.join()
    assert [a.error for a in askers] == [None, None]
    assert decodes.decodes - before == 2  # the second did not fit beside the first
    assert expected == [("interactive", 1), ("interactive", 2)]  # the second's leader waited for the first's client too


def test_a_background_decode_leaves_the_company_interactive_leaders_expect(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fit's decode between two rounds of many clients says nothing of how many of them come back: the
    next interactive leader expects the company of its own lane's last decode."""
    _, shared = engines
    decodes = shared._shared
    assert decodes is not None
    first, second, third = requests(shared)[:3]
    with context_lent(shared, WAIT_S):
        askers = ask_in_line(shared, [first, second])  # one interactive decode of two requests
    for asker in askers:
        asker.join()
    fit = Asker(shared, *third, lane="background")  # alone
    fit.join()
    expected = companies_expected(shared, monkeypatch)
    alone = Asker(shared, *first)
    alone.join()
    assert [a.error for a in (*askers, fit, alone)] == [None] * 4
    assert expected == [("interactive", 2)]


def test_a_leader_long_after_its_lanes_last_decode_waits_for_no_company(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clients a decode answered send their next requests at once, or not at once: a lone request
    that comes after they had their moment (the first after a burst) is decoded without waiting for them."""
    _, shared = engines
    decodes = shared._shared
    assert decodes is not None
    monkeypatch.setattr(lending, "GATHER_S", 2 * WAIT_S)  # a wait for the company outlasts the join below
    first, second, third = requests(shared)[:3]
    lasts = shared._pool._last
    lasts["interactive"].company = 1
    with context_lent(shared, WAIT_S):
        askers = ask_in_line(shared, [first, second])  # one decode of two: its lane expects two
    for asker in askers:
        asker.join()
    assert lasts["interactive"].company == 2
    with shared._pool._lock:  # as if that decode had ended longer ago than a leader waits
        lasts["interactive"].ended -= 2 * lending.GATHER_S
    alone = Asker(shared, *third)
    alone.join()  # within WAIT_S: no wait for the two clients of that decode
    assert [a.error for a in (*askers, alone)] == [None] * 3 and alone.found is not None


class Answerer:
    """A thread that answers one request through a ModelService, for its own caller."""

    def __init__(self, service: ModelService, body: dict[str, Any]) -> None:
        self.caller = Caller("interactive", Signal())
        self.found: dict[str, Any] | None = None
        self.thread = threading.Thread(target=self._run, args=(service, body), daemon=True)
        self.thread.start()

    def _run(self, service: ModelService, body: dict[str, Any]) -> None:
        with working_for(self.caller):
            self.found = service.answer(SystemOneRequest.model_validate(body)).wire()


def test_a_response_decoded_beside_others_says_so_and_one_alone_does_not(tiny_chat_path: Path) -> None:
    service = load_model(tiny_settings(tiny_chat_path, batch_requests=True, calibration="none"))
    try:
        bodies = [
            {"model": "m", "state": f"Ticket {i}: the parcel came late.", "questions": {"q": {"type": "noul"}}}
            for i in range(3)
        ]
        for body in bodies:  # cached first, so that each request below only decodes its question
            service.answer(SystemOneRequest.model_validate(body))
        alone = service.answer(SystemOneRequest.model_validate(bodies[0])).wire()
        assert "other_requests" not in alone["x_depends_on"]
        with context_lent(service.engine, WAIT_S):
            answerers = []
            for body in bodies:
                answerers.append(Answerer(service, body))
                until(lambda: queued(service.engine) == len(answerers), WAIT_S)
        for answerer in answerers:
            answerer.thread.join(WAIT_S)
        assert all(a.found is not None and a.found["x_depends_on"][-1] == "other_requests" for a in answerers)
    finally:
        service.close()


def test_a_batchs_requests_run_side_by_side_and_share_decodes(tiny_chat_path: Path) -> None:
    settings = tiny_settings(tiny_chat_path, batch_requests=True, calibration="none")
    service = load_model(settings)
    spec = ModelSpec.from_settings(settings)
    bodies = [
        {"model": spec.name, "state": f"Ticket {i}: the parcel came late.", "questions": {"q": {"type": "noul"}}}
        for i in range(6)
    ]
    try:
        with TestClient(create_app(settings, registry=ModelRegistry.serving(service, spec))) as client:
            for body in bodies:  # cached first: the batch's requests then only decode their questions
                assert client.post("/v1/systemone", json=body).status_code == 200
            found: list[Any] = []
            with context_lent(service.engine, WAIT_S):
                poster = threading.Thread(
                    target=lambda: found.append(client.post("/v1/systemone", json={"requests": bodies})),
                    daemon=True,
                )
                poster.start()
                until(lambda: queued(service.engine) == len(bodies), WAIT_S)  # every one at once
            poster.join(WAIT_S)
            metrics = client.get("/metrics").text
        results = found[0].json()["results"]
        assert [r["x_depends_on"][-1] for r in results] == ["other_requests"] * len(bodies)
        counted = {
            line.split("{")[0]: float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("onepass_shared_decode")
        }
        # the six cached one by one (each alone), then the batch's six in one decode
        assert counted == {"onepass_shared_decodes_total": 7.0, "onepass_shared_decode_requests_total": 12.0}
    finally:
        service.close()
