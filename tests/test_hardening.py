"""Limits, overload, timeouts, faults, auth keys, request ids, metrics and OpenAPI."""

from __future__ import annotations

import http.client
import json
import logging
import signal
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from app.answering.service import ModelService
from app.engine.caller import current
from app.fleet.processes import READY, ServerProcess
from app.http.server import create_app
from app.serving.registry import Intercept, ModelRegistry
from app.serving.specs import ModelsConfig, ModelSpec
from app.wire.contract import SystemOneRequest
from tests.support.borrowers import Borrower
from tests.support.interceptors import Faulty
from tests.support.live import RunningServer
from tests.support.llama_calls import LlamaCalls
from tests.support.settings import isolated_settings, tiny_settings
from tests.support.waiting import until

BODY: dict[str, Any] = {
    "model": "jev-latest",
    "state": "My order never arrived.",
    "questions": {"q": {"type": "noul", "instructions": "Is it about delivery?"}},
}


class Held:
    """An intercept (app/serving/registry.py): each request answered waits at the door until the test lets it
    through, and what it saw of its cancellation is kept."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.passed = threading.Event()
        self.saw_cancel: list[bool] = []

    def __call__(self, service: ModelService, request: SystemOneRequest | None) -> None:
        if request is None:
            return  # a lease for no one request: the model's load at startup
        self.entered.set()
        self.release.wait(30)
        self.saw_cancel.append(current().stopped)
        self.passed.set()


class CancelWatching:
    """An intercept: each request first waits (bounded) to be told nobody needs its answer any more."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.passed = threading.Event()
        self.saw_cancel: list[bool] = []

    def __call__(self, service: ModelService, request: SystemOneRequest | None) -> None:
        if request is None:
            return  # a lease for no one request: the model's load at startup
        self.entered.set()
        self.saw_cancel.append(current().stop.wait(30))
        self.passed.set()


@pytest.fixture
def held() -> Held:
    return Held()


def app_with(service: ModelService, path: Path, intercept: Intercept | None = None, **settings: Any) -> Any:
    registry = ModelRegistry.serving(service, intercept=intercept)
    return create_app(tiny_settings(path, **settings), registry=registry)


def test_too_many_questions_and_too_long_texts_are_422_before_inference(
    tiny_service: ModelService, tiny_chat_path: Path, llama_calls: LlamaCalls
) -> None:
    with TestClient(app_with(tiny_service, tiny_chat_path, max_questions=2, max_text_chars=50)) as client:
        before = llama_calls.decodes
        many = client.post("/v1/systemone", json=BODY | {"questions": {f"q{i}": {"type": "noul"} for i in range(3)}})
        assert many.status_code == 422
        assert many.json()["detail"][0]["loc"] == ["body", "questions"]
        long = client.post(
            "/v1/systemone",
            json=BODY | {"questions": {"q": {"type": "choice", "criteria": {"short": None, "x" * 51: None}}}},
        )
        assert long.status_code == 422
        assert long.json()["detail"][0]["loc"] == ["body", "questions", "q", "choice", "criteria", "x" * 51]
        assert llama_calls.decodes == before


def test_several_keys_from_a_file_guard_every_route_but_the_probes_and_none_is_logged(
    tiny_service: ModelService, tiny_chat_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nalpha-key\n\nbeta-key\n")
    caplog.set_level(logging.DEBUG)
    with TestClient(app_with(tiny_service, tiny_chat_path, api_key="gamma-key", api_key_file=keys)) as client:
        for key in ("alpha-key", "beta-key", "gamma-key"):
            assert (
                client.post("/v1/systemone", json=BODY, headers={"Authorization": f"Bearer {key}"}).status_code == 200
            )
        for headers in ({}, {"Authorization": "Bearer alpha"}, {"Authorization": "Bearer # team keys"}):
            assert client.post("/v1/systemone", json=BODY, headers=headers).status_code == 401
        for route in ("/metrics", "/openapi.json", "/v1/cache", "/v1/models", "/no-such-route"):
            response = client.get(route)
            assert response.status_code == 401, route
            assert response.json()["detail"]["error_type"] == "authentication_error"
        for route in ("/v1/models/tiny-chat/load", "/v1/config/reload"):
            assert client.post(route).status_code == 401, route
        # a load balancer's probes carry no key: readiness and liveness are public, and say nothing secret
        assert client.get("/health").json() == {"status": "ok", "model": "tiny-chat"}
        assert client.get("/health/live").status_code == 200
    assert not any(key in caplog.text for key in ("alpha-key", "beta-key", "gamma-key"))


def test_a_full_queue_answers_503_with_retry_after(
    held: Held, tiny_service: ModelService, tiny_chat_path: Path
) -> None:
    app = app_with(tiny_service, tiny_chat_path, held, max_queue=0)
    with TestClient(app) as client, ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.post, "/v1/systemone", json=BODY)
        assert held.entered.wait(30)
        busy = client.post("/v1/systemone", json=BODY)
        assert busy.status_code == 503
        assert busy.json()["detail"]["error_type"] == "overloaded"
        assert busy.headers["retry-after"] == "1"
        held.release.set()
        assert first.result(timeout=60).status_code == 200
        assert client.post("/v1/systemone", json=BODY).status_code == 200


def test_a_prompt_too_long_is_422_while_its_model_is_full(
    held: Held, tiny_service: ModelService, tiny_chat_path: Path
) -> None:
    too_long = BODY | {"state": "word " * 9000}  # more tokens than the tiny model's 8192-token context
    app = app_with(tiny_service, tiny_chat_path, held, max_queue=0)
    with TestClient(app) as client, ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.post, "/v1/systemone", json=BODY)
        assert held.entered.wait(30)  # the model's one place is taken
        assert client.post("/v1/systemone", json=BODY).status_code == 503
        refused = client.post("/v1/systemone", json=too_long)
        assert refused.status_code == 422
        assert refused.json()["detail"][0]["loc"] == ["body", "state"]
        assert refused.json()["detail"][0]["type"] == "too_long"
        # in a batch answered in its response, too: the long request gets its 422 and takes no place
        batch = client.post("/v1/systemone", json={"requests": [too_long]})
        assert batch.status_code == 200
        assert batch.json()["results"][0]["error"]["status"] == 422
        held.release.set()
        assert first.result(timeout=60).status_code == 200


def test_admission_is_per_model_a_busy_model_does_not_turn_away_another(
    held: Held, tiny_service: ModelService, tiny_chat_path: Path
) -> None:
    specs = (
        ModelSpec("busy", tiny_chat_path, settings=isolated_settings(contexts=1, session_cache_disk_bytes=0)),
        ModelSpec("idle", tiny_chat_path, settings=isolated_settings(contexts=1, session_cache_disk_bytes=0)),
    )
    registry = ModelRegistry(
        ModelsConfig(specs, "busy", 2),
        loader=lambda spec: tiny_service,
        intercept=lambda service, request: held(service, request) if request and request.model == "busy" else None,
    )
    app = create_app(tiny_settings(tiny_chat_path, max_queue=0), registry=registry)
    with TestClient(app) as client, ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.post, "/v1/systemone", json=BODY | {"model": "busy"})
        assert held.entered.wait(30)
        assert client.post("/v1/systemone", json=BODY | {"model": "busy"}).status_code == 503  # its one context
        assert client.post("/v1/systemone", json=BODY | {"model": "idle"}).status_code == 200  # a free pool
        metrics = client.get("/metrics").text
        assert 'onepass_in_flight{model="busy"} 1.0' in metrics
        held.release.set()
        assert first.result(timeout=60).status_code == 200


def test_a_request_past_its_timeout_is_504_and_its_work_is_dropped(
    held: Held, tiny_service: ModelService, tiny_chat_path: Path, llama_calls: LlamaCalls
) -> None:
    with TestClient(app_with(tiny_service, tiny_chat_path, held, request_timeout=0.2)) as client:
        before = llama_calls.decodes
        response = client.post("/v1/systemone", json=BODY | {"state": "a state for the timeout test"})
        assert response.status_code == 504
        assert response.json()["detail"]["error_type"] == "timeout"
        held.release.set()
        assert held.passed.wait(30)
    assert held.saw_cancel == [True]  # the abandoned worker saw the cancellation ...
    assert llama_calls.decodes == before  # ... and ran no llama.cpp work


def test_a_client_that_disconnects_leaves_no_work_running(
    tiny_service: ModelService, tiny_chat_path: Path, llama_calls: LlamaCalls
) -> None:
    watching = CancelWatching()
    running = RunningServer(tiny_settings(tiny_chat_path), ModelRegistry.serving(tiny_service, intercept=watching))
    try:
        body = json.dumps(BODY | {"state": "a state for the disconnect test"}).encode()
        port = int(running.base_url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(
                b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            assert watching.entered.wait(30)
            before = llama_calls.decodes
        assert watching.passed.wait(30)  # closing the socket cancelled the request ...
        assert watching.saw_cancel == [True]
        assert llama_calls.decodes == before  # ... before any llama.cpp work
    finally:
        running.stop()


def test_a_fault_inside_llama_cpp_fails_that_request_only(tiny_service: ModelService, tiny_chat_path: Path) -> None:
    with TestClient(app_with(tiny_service, tiny_chat_path)) as client:
        expected = client.post("/v1/systemone", json=BODY).json()["answers"]
    with TestClient(app_with(tiny_service, tiny_chat_path, Faulty()), raise_server_exceptions=False) as client:
        failed = client.post("/v1/systemone", json=BODY)
        assert failed.status_code == 500
        assert failed.json() == {
            "detail": {"error_type": "internal_error", "message": "internal error; see the server log"}
        }
        assert client.post("/v1/systemone", json=BODY).json()["answers"] == expected


def test_an_internal_error_keeps_the_keep_alive_connection(tiny_service: ModelService, tiny_chat_path: Path) -> None:
    running = RunningServer(tiny_settings(tiny_chat_path), ModelRegistry.serving(tiny_service, intercept=Faulty()))
    host, port = running.base_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.connect()
        first_socket = connection.sock
        for expected in (500, 200):  # the first request hits the planted fault, the second is fine
            connection.request(
                "POST", "/v1/systemone", body=json.dumps(BODY), headers={"Content-Type": "application/json"}
            )
            response = connection.getresponse()
            assert response.status == expected
            response.read()
            assert connection.sock is first_socket  # not closed and silently reopened by http.client
    finally:
        connection.close()
        running.stop()


def test_request_ids_are_echoed_or_made_and_each_request_logs_one_line(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="onepass.requests")
    given = client.post("/v1/systemone", json=BODY, headers={"X-Request-Id": "abc-123"})
    assert given.headers["x-request-id"] == "abc-123"
    made = client.get("/health/live").headers["x-request-id"]
    assert len(made) == 32
    records = [r for r in caplog.records if r.name == "onepass.requests"]
    levels = {json.loads(r.getMessage())["request_id"]: r.levelno for r in records}
    # a load balancer's healthy probe (every second) is logged at debug, a request at info
    assert (levels["abc-123"], levels[made]) == (logging.INFO, logging.DEBUG)
    lines = [json.loads(r.getMessage()) for r in records]
    line = next(entry for entry in lines if entry["request_id"] == "abc-123")
    assert line["route"] == "/v1/systemone" and line["status"] == 200 and line["model"] == "tiny-chat"
    assert line["questions"] == 1 and line["cache"] in ("hit", "miss") and line["input_tokens"] > 0
    assert set(line["timing_ms"]) == {"prefill", "restore", "decode", "calibrate", "total"}


def test_a_request_id_comes_back_byte_for_byte(live_url: str) -> None:
    sent = "ticket-é-№7".encode()  # not ASCII: a header is bytes, and an id is echoed as sent
    connection = http.client.HTTPConnection(urlsplit(live_url).netloc, timeout=30)
    try:
        connection.putrequest("GET", "/health/live")
        connection.putheader("X-Request-Id", sent)
        connection.endheaders()
        response = connection.getresponse()
        response.read()
    finally:
        connection.close()
    echoed = response.getheader("x-request-id")
    assert echoed is not None and echoed.encode("latin-1") == sent  # http.client reads header bytes as latin-1


def test_metrics_count_requests_latency_and_cache_in_prometheus_format(client: TestClient) -> None:
    client.post("/v1/systemone", json=BODY | {"state": "metrics state"})
    client.post("/v1/systemone", json=BODY | {"state": "metrics state"})
    client.post("/v1/systemone", json={"bad": True})
    text = client.get("/metrics").text
    assert 'onepass_requests_total{route="/v1/systemone",status="200"} 2.0' in text
    assert 'onepass_requests_total{route="/v1/systemone",status="422"} 1.0' in text
    assert 'onepass_request_seconds_count{cache="hit",route="/v1/systemone"} 1.0' in text
    assert 'onepass_request_seconds_count{cache="miss",route="/v1/systemone"} 1.0' in text
    for name in (
        "onepass_cache_entries",
        "onepass_cache_tokens",
        "onepass_cache_bytes",
        "onepass_cache_hits_total",
        "onepass_cache_misses_total",
        "onepass_cache_evictions_total",
        "onepass_prefilled_tokens_total",
        "onepass_queue_depth",
        "onepass_in_flight",
    ):
        assert name in text, name
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(families) == len(set(families)), "a metric family was written twice"


def test_openapi_describes_the_contract(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.1")
    operation = spec["paths"]["/v1/systemone"]["post"]
    assert {"200", "401", "404", "413", "422", "503"} <= set(operation["responses"])
    request_schema = spec["components"]["schemas"]["SystemOneRequest"]
    assert set(request_schema["required"]) == {"model", "state", "questions"}
    # images come as typesafe-sdk sends them: the JSON in a `request` part, each image a part of its own
    form = operation["requestBody"]["content"]["multipart/form-data"]
    json_body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert form["schema"]["required"] == ["request"] and form["schema"]["properties"]["request"] == json_body
    assert form["schema"]["additionalProperties"]["format"] == "binary" and form["schema"]["maxProperties"] == 9
    assert form["encoding"]["request"]["contentType"] == "application/json"


def test_sigterm_finishes_in_flight_requests_then_exits(tiny_chat_path: Path) -> None:
    """The request is in flight when the signal comes, by construction: the server has started it (it
    answered `Expect: 100-continue`, which the app's first read of the body sends) and cannot finish it
    before the client sends the body, which the client does only once the server logged its shutdown."""
    server = ServerProcess(
        ["--model", str(tiny_chat_path), "--n-ctx", "8192", "--threads", "1", "--log-level", "debug", "--config", ""]
    )
    try:
        server.wait_for(READY)  # the model loads after the port opens
        body = json.dumps(BODY).encode()
        address = urlsplit(server.url)
        with socket.create_connection((address.hostname, address.port), timeout=60) as connection:
            connection.sendall(
                b"POST /v1/systemone HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
            )
            interim = b""
            while b"\r\n\r\n" not in interim:
                interim += connection.recv(64)
            assert interim.startswith(b"HTTP/1.1 100")  # the app is reading the body
            logged = len(server.lines)
            server.process.send_signal(signal.SIGTERM)
            server.wait_for("Shutting down", timeout=60, after=logged)
            connection.sendall(body)
            reply = b""
            while b"\r\n\r\n" not in reply:
                reply += connection.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
        # uvicorn re-raises the signal once it has shut down, so the exit status reports SIGTERM
        assert server.process.wait(60) in (0, -signal.SIGTERM)
        shutdown = next(i for i, line in enumerate(server.lines) if "Shutting down" in line)
        answered = next(i for i, line in enumerate(server.lines) if '"route": "/v1/systemone", "status": 200' in line)
        assert shutdown < answered  # the request was answered after the shutdown began
    finally:
        server.stop()


def sample_values(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Each sample of metric `name` in a /metrics text, by its labels."""
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_metrics_show_each_lanes_waits_and_the_rows_a_decode_takes(
    client: TestClient, tiny_service: ModelService
) -> None:
    before = client.get("/metrics").text
    holder = Borrower(tiny_service.engine)
    assert holder.got.wait(30)
    answered: list[Any] = []
    asking = threading.Thread(
        target=lambda: answered.append(client.post("/v1/systemone", json=BODY | {"state": "a waiting state"})),
        daemon=True,
    )
    asking.start()
    try:
        until(lambda: tiny_service.engine._pool.waiting("interactive") == 1, 30)
        during = client.get("/metrics").text
    finally:
        holder.let_go()
        asking.join(30)
    assert not asking.is_alive() and answered[0].status_code == 200
    after = client.get("/metrics").text
    (model,) = {dict(labels)["model"] for labels in sample_values(during, "onepass_context_waiting")}
    waiting = sample_values(during, "onepass_context_waiting")
    assert waiting[(("lane", "interactive"), ("model", model))] == 1
    assert waiting[(("lane", "background"), ("model", model))] == 0
    waited = [sample_values(text, "onepass_context_wait_seconds_total") for text in (before, after)]
    key = (("lane", "interactive"), ("model", model))
    assert waited[1][key] > waited[0].get(key, 0.0)
    decodes = [sample_values(text, "onepass_decodes_total").get((("model", model),), 0.0) for text in (before, after)]
    rows = [sample_values(text, "onepass_decoded_rows_total").get((("model", model),), 0.0) for text in (before, after)]
    assert decodes[1] > decodes[0] and rows[1] - rows[0] >= decodes[1] - decodes[0]  # a row a decode at least
