"""Work that nobody waits for any more stops: a client that gives up (a single request, a batch answered
in its response) or a batch job that is cancelled leaves the model free for the next request within
a step of the work, not after all of it, and leaves nothing behind that changes a later answer.

On a real uvicorn server over the tiny model with one context, as a user's pipeline meets it: several
requests about long new states, each given up by its client after a fraction of a second, then one
short request. The bound is the work itself, measured in the same run: the short request may wait
for at most one long request's worth of work (the old server made it wait for every abandoned one).
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.answering.service import ModelService
from app.serving.registry import ModelRegistry
from app.wire.contract import SystemOneRequest
from tests.support.live import RunningServer
from tests.support.llama_calls import count_llama_calls
from tests.support.loading import load_model
from tests.support.settings import tiny_settings

QUESTIONS = 20
GIVE_UP_S = 0.3  # the clients' timeout: well under a long request's work on any machine


def long_state(n: int) -> str:
    """A state of a few thousand tokens, different for each n (so no two share a snapshot)."""
    return f"ticket {n}: " + " ".join(f"order {n}-{i} came late again and the box was open." for i in range(110))


def long_body(n: int) -> dict[str, Any]:
    questions = {f"q{k}": {"type": "noul", "instructions": f"Is point {k} about delivery?"} for k in range(QUESTIONS)}
    return {"model": "jev-latest", "state": long_state(n), "questions": questions}


SHORT = {
    "model": "jev-latest",
    "state": "Where is my parcel?",
    "questions": {"q": {"type": "noul", "instructions": "Is it about delivery?"}},
}


@pytest.fixture
def served(tiny_chat_path: Path) -> Iterator[tuple[str, ModelService]]:
    """A server of its own (one context, a cache of its own), and its service."""
    settings = tiny_settings(tiny_chat_path, max_sync_batch_items=2, request_timeout=300)
    service = load_model(settings)
    running = RunningServer(settings, ModelRegistry.serving(service))
    try:
        yield running.base_url, service
    finally:
        running.stop()
        service.close()


def in_flight(url: str) -> float:
    """The requests the server has admitted and not yet answered."""
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("onepass_in_flight{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def timed_post(url: str, body: Any, timeout: float = 300) -> tuple[float, httpx.Response]:
    began = time.perf_counter()
    response = httpx.post(url + "/v1/systemone", json=body, timeout=timeout)
    return time.perf_counter() - began, response


def give_up(url: str, bodies: list[Any]) -> None:
    """Send each body from its own client at once; each client gives up after GIVE_UP_S."""

    def send(body: Any) -> None:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url + "/v1/systemone", json=body, timeout=GIVE_UP_S)

    threads = [threading.Thread(target=send, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()


def decoded_rows(url: str) -> int:
    """The rows the server's llama_decodes have decoded so far, each piece of a prefill as it ends."""
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("onepass_decoded_rows_total{"):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("no onepass_decoded_rows_total in /metrics")


def give_up_after_rows(url: str, body: Any, rows: int) -> None:
    """Send `body` on a connection of its own, and close it once the server has decoded `rows` more rows:
    the attempt has paid for that much of its prefill when its client gives up, however slow the machine."""
    before = decoded_rows(url)
    address = httpx.URL(url)
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/systemone HTTP/1.1\r\nHost: {address.host}:{address.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    assert address.port is not None
    with socket.create_connection((address.host, address.port), timeout=60) as connection:
        connection.sendall(head.encode() + payload)
        deadline = time.monotonic() + 60
        while decoded_rows(url) < before + rows:
            assert time.monotonic() < deadline, f"the server decoded no {rows} rows of the request in 60 s"


def prefilled(url: str) -> int:
    """The tokens the server has prefilled so far (a prefill counts once it has finished)."""
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("onepass_prefilled_tokens_total{"):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("no onepass_prefilled_tokens_total in /metrics")


def test_abandoned_requests_batches_and_jobs_stop_and_change_no_later_answer(
    served: tuple[str, ModelService], tiny_service: ModelService
) -> None:
    url, service = served
    idle = statistics.median(timed_post(url, SHORT)[0] for _ in range(3))
    long_s, first = timed_post(url, long_body(0))
    assert first.status_code == 200
    state_tokens = first.json()["usage"]["input_tokens"]
    bound = idle + long_s  # the next request waits for at most one long request's worth of work

    def seen(after: str, waited: float) -> str:
        return f"after {after} the next request waited {waited:.2f} s (idle {idle:.2f} s, one long {long_s:.2f} s)"

    # single requests, each given up by its client: only the first had a context, the others waited
    before = prefilled(url)
    give_up(url, [long_body(n) for n in (1, 2, 3, 4)])
    waited, short = timed_post(url, SHORT)
    assert short.status_code == 200
    assert waited < bound, seen("single requests", waited)
    assert prefilled(url) - before < 2 * state_tokens  # the abandoned states were not prefilled for nobody

    # a batch answered in its response, given up by its client
    give_up(url, [{"requests": [long_body(5), long_body(6)]}])
    waited, short = timed_post(url, SHORT)
    assert short.status_code == 200
    assert waited < bound, seen("a batch", waited)

    # a batch job, cancelled by its client: DELETE answers once the job has stopped
    job = httpx.post(url + "/v1/systemone", json={"requests": [long_body(n) for n in (7, 8, 9, 10)]}, timeout=60)
    assert job.status_code == 202
    began = time.perf_counter()
    cancelled = httpx.delete(url + job.headers["Location"], timeout=60)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    short = timed_post(url, SHORT)[1]
    waited = time.perf_counter() - began  # from the cancel to the short answer
    assert short.status_code == 200
    assert waited < bound, seen("a job", waited)

    # nothing the abandoned work left behind (a context cut off mid-prefill, the caches) changes an
    # answer: the same states answered now are the answers of a server that never saw them, bit for bit
    assert service.engine.n_ctx == tiny_service.engine.n_ctx
    for n in (1, 5, 7):
        _, again = timed_post(url, long_body(n))
        assert again.status_code == 200
        fresh = tiny_service.answer(SystemOneRequest.model_validate(long_body(n)))
        assert again.json()["answers"] == json.loads(fresh.to_json())["answers"]


def test_a_short_request_is_answered_while_a_long_new_state_is_still_being_prefilled(
    served: tuple[str, ModelService],
) -> None:
    """One context: the long state's prefill hands the context over between two of its pieces, so a
    hit that comes meanwhile is answered before the long request, not after it."""
    url, _ = served
    assert timed_post(url, SHORT)[1].status_code == 200  # SHORT's state is cached: a hit from now on
    finished: list[str] = []
    long_request = threading.Thread(target=lambda: finished.append(str(timed_post(url, long_body(11))[1].status_code)))
    long_request.start()
    deadline = time.monotonic() + 60
    while in_flight(url) < 1:  # admitted: its worker goes straight on to the context and the prefill
        assert time.monotonic() < deadline, "the long request never came in"
    hit = timed_post(url, SHORT)[1]
    finished.append(f"hit {hit.status_code}")
    long_request.join(120)
    assert finished == ["hit 200", "200"]


def test_a_retry_of_a_request_given_up_goes_on_from_the_prefill_it_had_paid_for(
    served: tuple[str, ModelService], tiny_service: ModelService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that gives up and sends the same request again, as the SDK does: the retry prefills only
    what the first attempt had not, and answers as a server that never saw the first attempt."""
    url, _ = served
    # the system part's snapshot and the questions' priors first, so that the rows counted next are the state's
    assert timed_post(url, {**long_body(12), "state": SHORT["state"]})[1].status_code == 200
    give_up_after_rows(url, long_body(12), 512)  # a piece's rows: what the retry need not decode again
    deadline = time.monotonic() + 60
    while in_flight(url) > 0:  # the abandoned attempt stops at its next piece
        assert time.monotonic() < deadline, "the abandoned request never stopped"
    calls = count_llama_calls(monkeypatch)
    again = timed_post(url, long_body(12))[1]
    assert again.status_code == 200
    state_rows = again.json()["usage"]["input_tokens"]  # the prefix and the questions' rows, at most
    assert calls.rows < state_rows - 512  # at least one piece of the state was not decoded again
    fresh = tiny_service.answer(SystemOneRequest.model_validate(long_body(12)))
    assert again.json()["answers"] == json.loads(fresh.to_json())["answers"]
