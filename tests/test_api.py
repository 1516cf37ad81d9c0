"""The HTTP contract (../shared/CONTRACT.md) over Starlette's TestClient, with the tiny model."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from backports.zstd import compress as zstd_compress
from starlette.testclient import TestClient

from app.answering.service import ModelService
from app.config import Settings
from app.http.server import create_app
from app.platform.tiny_images import png
from app.serving.registry import ModelRegistry
from tests.support.borrowers import Borrower
from tests.support.loading import load_model
from tests.support.settings import tiny_settings
from tests.support.waiting import until

TICKET: dict[str, Any] = json.loads((Path(__file__).parent.parent / "examples" / "ticket.json").read_text())


def post(client: TestClient, body: Any, **kwargs: Any) -> Any:
    return client.post("/v1/systemone", json=body, **kwargs)


def body_with(**changes: Any) -> dict[str, Any]:
    return {**TICKET, **changes}


def details(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, list) and detail
    for item in detail:
        assert item["loc"][0] == "body" and isinstance(item["msg"], str) and isinstance(item["type"], str)
    return detail


def test_the_readme_example_answers_every_question_in_its_type(client: TestClient) -> None:
    response = post(client, TICKET)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    data = response.json()
    assert data["model"] == "tiny-chat"
    assert set(data["answers"]) == {"refund", "team", "anger"}
    assert data["answers"]["refund"]["type"] == "noul"
    team = data["answers"]["team"]
    assert team["choice"] == max(team["probabilities"], key=team["probabilities"].get)
    assert list(team["probabilities"]) == ["Billing", "Technical"]
    p = team["probabilities"]["Billing"]
    assert team["confidence"] == pytest.approx((max(p, 1 - p) - 0.5) / 0.5)
    anger = data["answers"]["anger"]
    assert anger["legend"] == {"0": "Calm", "1": "Annoyed", "2": "Furious"}
    expected = 0.0
    for i, pi in enumerate(anger["probabilities"].values()):
        expected += i * pi
    assert anger["score"] == expected
    assert data["usage"]["output_tokens"] == 3 and data["usage"]["input_tokens"] > 3
    assert data["x_cache"] in {"hit", "miss"}


def test_jev_latest_and_the_served_name_are_the_same_model(client: TestClient) -> None:
    a = post(client, body_with(model="jev-latest")).json()
    b = post(client, body_with(model="tiny-chat")).json()
    assert a["answers"] == b["answers"] and a["model"] == b["model"] == "tiny-chat"


def test_unknown_model_is_404_listing_the_known_names(client: TestClient) -> None:
    response = post(client, body_with(model="gpt-5"))
    assert response.status_code == 404
    detail = response.json()["detail"]
    assert detail["error_type"] == "model_not_found"
    assert "tiny-chat" in detail["message"] and "jev-latest" in detail["message"]


def test_structured_state_is_canonical_json(client: TestClient) -> None:
    a = post(client, body_with(state={"b": [1, 2], "a": "ü"})).json()
    b = post(client, body_with(state=json.loads('{ "a" : "ü",  "b":[1,2] }'))).json()
    c = post(client, body_with(state='{"a":"ü","b":[1,2]}')).json()
    assert a["answers"] == b["answers"] == c["answers"]
    assert b["x_cache"] == "hit"


def test_structured_text_fields_are_accepted_and_canonical(client: TestClient) -> None:
    q1 = {"type": "noul", "instructions": {"ask": "refund?", "lang": "en"}, "criteria": {"true": ["asks", "money"]}}
    q2 = {"type": "noul", "instructions": {"lang": "en", "ask": "refund?"}, "criteria": {"true": ["asks", "money"]}}
    a = post(client, body_with(questions={"x": q1})).json()["answers"]["x"]
    b = post(client, body_with(questions={"x": q2})).json()["answers"]["x"]
    assert a == b


def test_option_names_come_back_byte_for_byte(client: TestClient) -> None:
    names = ["환불", "🙂 happy", "two  spaces", "Ünïcödé", "\u00e9 vs e\u0301"]
    body = body_with(questions={"q": {"type": "choice", "criteria": dict.fromkeys(names)}})
    response = client.post(
        "/v1/systemone",
        content=json.dumps(body, ensure_ascii=False).encode(),
        headers={"content-type": "application/json"},
    )
    answer = response.json()["answers"]["q"]
    assert list(answer["probabilities"]) == names
    assert answer["choice"] in names


def test_255_options_are_answered(client: TestClient) -> None:
    criteria = {f"option {i:03d}": None for i in range(255)}
    answer = post(client, body_with(questions={"q": {"type": "choice", "criteria": criteria}})).json()["answers"]["q"]
    assert list(answer["probabilities"]) == list(criteria)
    assert sum(answer["probabilities"].values()) == pytest.approx(1.0)


def test_ten_score_levels_and_noul_criteria_shapes(client: TestClient) -> None:
    questions = {
        "s": {"type": "score", "criteria": [f"level {i}" for i in range(10)]},
        "n1": {"type": "noul"},
        "n2": {"type": "noul", "instructions": None, "criteria": None},
        "n3": {"type": "noul", "criteria": {"true": "yes means this"}},
        "n4": {"type": "noul", "criteria": {"false": "no means that"}},
    }
    data = post(client, body_with(questions=questions)).json()
    assert set(data["answers"]) == set(questions)
    assert list(data["answers"]["s"]["probabilities"]) == [str(i) for i in range(10)]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"state": "x", "questions": {"q": {"type": "noul"}}}, ["body", "model"]),
        ({"model": "jev-latest", "questions": {"q": {"type": "noul"}}}, ["body", "state"]),
        ({"model": "jev-latest", "state": "x"}, ["body", "questions"]),
        ({"model": "jev-latest", "state": "x", "questions": {}}, ["body", "questions"]),
        ({"model": "jev-latest", "state": 5, "questions": {"q": {"type": "noul"}}}, ["body", "state"]),
        ({"model": 7, "state": "x", "questions": {"q": {"type": "noul"}}}, ["body", "model"]),
        ({"model": "jev-latest", "state": "x", "questions": {"q": {"type": "essay"}}}, ["body", "questions", "q"]),
        ({"model": "jev-latest", "state": "x", "questions": {"q": {}}}, ["body", "questions", "q"]),
        ({"model": "jev-latest", "state": "x", "questions": {"": {"type": "noul"}}}, ["body", "questions"]),
        (
            {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "choice", "criteria": {"a": None}}}},
            ["body", "questions", "q", "choice", "criteria"],
        ),
        (
            {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "choice"}}},
            ["body", "questions", "q", "choice", "criteria"],
        ),
        (
            {
                "model": "jev-latest",
                "state": "x",
                "questions": {"q": {"type": "choice", "criteria": {str(i): None for i in range(256)}}},
            },
            ["body", "questions", "q", "choice", "criteria"],
        ),
        (
            {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "score", "criteria": ["a"]}}},
            ["body", "questions", "q", "score", "criteria"],
        ),
        (
            {
                "model": "jev-latest",
                "state": "x",
                "questions": {"q": {"type": "score", "criteria": [str(i) for i in range(11)]}},
            },
            ["body", "questions", "q", "score", "criteria"],
        ),
        (
            {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "score", "criteria": {"a": 1, "b": 2}}}},
            ["body", "questions", "q", "score", "criteria"],
        ),
        (
            {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "instructions": 3}}},
            ["body", "questions", "q", "noul", "instructions"],
        ),
        (
            {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "criteria": "yes"}}},
            ["body", "questions", "q", "noul", "criteria"],
        ),
        (
            {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul"}}, "assets": {"a": {}}},
            ["body", "assets"],
        ),
        ([1, 2, 3], ["body"]),
    ],
)
def test_invalid_requests_get_422_pointing_at_the_field(client: TestClient, body: Any, loc: list[Any]) -> None:
    items = details(post(client, body))
    assert any(item["loc"][: len(loc)] == loc for item in items), items


def test_an_image_asset_is_rejected_with_a_vision_message(client: TestClient) -> None:
    image = {"type": "image", "format": "png", "data_base64": base64.b64encode(png()).decode()}
    items = details(post(client, body_with(state="<img>", assets={"img": image})))
    assert items == [
        {
            "loc": ["body", "assets"],
            "msg": "image assets need a vision model; 'tiny-chat' has no vision projector, and no model here "
            "takes images",
            "type": "images_unsupported",
            "input": 1,
        }
    ]


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"model": NaN}', b"\xff\xfe"])
def test_malformed_json_is_422_json_invalid(client: TestClient, raw: bytes) -> None:
    response = client.post("/v1/systemone", content=raw, headers={"content-type": "application/json"})
    assert details(response)[0]["type"] == "json_invalid"


def test_unknown_top_level_fields_are_ignored(client: TestClient) -> None:
    assert post(client, body_with(temperature=0.3, stream=True)).status_code == 200


def test_a_state_longer_than_the_context_is_422_naming_the_counts(client: TestClient) -> None:
    items = details(post(client, body_with(state="word " * 20000)))
    assert items[0]["loc"] == ["body", "state"]
    assert "8192" in items[0]["msg"]


def test_a_body_over_the_limit_is_413(tiny_service: ModelService, tiny_chat_path: Path) -> None:
    app = create_app(tiny_settings(tiny_chat_path, max_body_bytes=1000), registry=ModelRegistry.serving(tiny_service))
    with TestClient(app) as small:
        response = post(small, body_with(state="x" * 2000))
        assert response.status_code == 413
        assert response.json()["detail"]["error_type"] == "request_too_large"


def test_zstd_and_gzip_bodies_are_read(client: TestClient) -> None:
    raw = json.dumps(TICKET).encode()
    plain = post(client, TICKET).json()["answers"]
    for encoding, data in [("zstd", zstd_compress(raw)), ("gzip", gzip.compress(raw))]:
        response = client.post(
            "/v1/systemone", content=data, headers={"content-type": "application/json", "content-encoding": encoding}
        )
        assert response.status_code == 200, response.text
        assert response.json()["answers"] == plain


class TestAuth:
    @pytest.fixture
    def secured(self, tiny_service: ModelService, tiny_chat_path: Path) -> Any:
        app = create_app(tiny_settings(tiny_chat_path, api_key="s3cret"), registry=ModelRegistry.serving(tiny_service))
        with TestClient(app) as c:
            yield c

    @pytest.mark.parametrize("header", [None, "Bearer wrong", "s3cret", "Basic s3cret", "Bearer "])
    def test_missing_or_wrong_key_is_401(self, secured: TestClient, header: str | None) -> None:
        headers = {} if header is None else {"authorization": header}
        for response in (post(secured, TICKET, headers=headers), secured.get("/v1/models", headers=headers)):
            assert response.status_code == 401
            assert response.json()["detail"]["error_type"] == "authentication_error"

    def test_the_right_key_is_accepted_and_liveness_needs_none(self, secured: TestClient) -> None:
        assert post(secured, TICKET, headers={"authorization": "Bearer s3cret"}).status_code == 200
        assert secured.get("/health/live").status_code == 200

    def test_with_auth_off_any_authorization_header_is_ignored(self, client: TestClient) -> None:
        assert post(client, TICKET, headers={"authorization": "Bearer whatever"}).status_code == 200


def test_answers_carry_the_states_affinity_key_and_every_response_the_replica(
    tiny_service: ModelService, tiny_chat_path: Path
) -> None:
    app = create_app(
        tiny_settings(tiny_chat_path, replica_name="replica7"), registry=ModelRegistry.serving(tiny_service)
    )
    with TestClient(app) as client:
        # what a client computes to route by state: SHA-256 of the state's text, 16 hex digits
        # (without surrounding space: the prompt and the cache key trim it, so the routing key does too)
        padded = post(client, body_with(state=" Charged twice.\n"))
        assert padded.headers["x-onepass-prefix-key"] == hashlib.sha256(b"Charged twice.").hexdigest()[:16]
        trimmed = post(client, body_with(state="Charged twice."))
        assert trimmed.headers["x-onepass-prefix-key"] == padded.headers["x-onepass-prefix-key"]
        assert trimmed.json()["x_cache"] == "hit"  # one snapshot, so one replica
        one_way = post(client, body_with(state={"b": [1, 2], "a": "\u00fc"}))
        other_way = post(
            client, {**TICKET, "state": {"a": "\u00fc", "b": [1, 2]}, "questions": {"x": {"type": "noul"}}}
        )
        canonical = '{"a":"\u00fc","b":[1,2]}'.encode()
        assert one_way.headers["x-onepass-prefix-key"] == other_way.headers["x-onepass-prefix-key"]
        assert one_way.headers["x-onepass-prefix-key"] == hashlib.sha256(canonical).hexdigest()[:16]
        for response in (one_way, client.get("/health"), post(client, body_with(state=None))):
            assert response.headers["x-onepass-replica"] == "replica7"


def test_models_lists_every_name_in_both_shapes(client: TestClient) -> None:
    data = client.get("/v1/models").json()
    assert data["object"] == "list"
    assert [m["id"] for m in data["data"]] == ["tiny-chat", "jev-latest"]
    assert [m["name"] for m in data["models"]] == ["tiny-chat", "jev-latest"]
    for entry in data["models"]:  # the System One fields, then onepass's x_ extras
        assert {"name", "description", "release_date"} <= set(entry)
        assert all(key.startswith("x_") for key in set(entry) - {"name", "description", "release_date"})
    assert all(m["object"] == "model" and m["owned_by"] == "onepass" for m in data["data"])
    # the calibration setting, not the fit an answer's x_calibration names
    assert all(m["x_calibration_mode"] == "contextual" and "x_calibration" not in m for m in data["models"])


def test_cache_stats_route_reports_hits(client: TestClient) -> None:
    post(client, body_with(state="stats state"))
    post(client, body_with(state="stats state"))
    stats = client.get("/v1/cache").json()["tiny-chat"]
    assert stats["hits"] >= 1 and stats["entries"] >= 1 and stats["bytes"] > 0
    assert stats["max_entries"] == 16 and stats["max_tokens"] == 32768


def test_health_is_503_while_the_model_loads_then_200(tiny_chat_path: Path) -> None:
    release = threading.Event()

    def slow_loader(settings: Settings) -> ModelRegistry:
        assert release.wait(60), "the test never let the model load"
        return ModelRegistry.serving(load_model(settings))  # the app owns (and closes) what it loads

    app = create_app(tiny_settings(tiny_chat_path), loader=slow_loader)
    with TestClient(app) as c:
        assert c.get("/health/live").status_code == 200
        assert c.get("/health").status_code == 503
        busy = post(c, TICKET)
        assert busy.status_code == 503 and busy.headers["retry-after"]
        assert busy.json()["detail"]["error_type"] == "overloaded"
        release.set()
        assert app.state.runtime.loaded.wait(30)
        assert c.get("/health").json() == {"status": "ok", "model": "tiny-chat"}
        assert post(c, TICKET).status_code == 200


def test_a_model_that_fails_to_load_keeps_health_503_with_the_reason(tmp_path: Path) -> None:
    app = create_app(tiny_settings(tmp_path / "missing.gguf"))
    with TestClient(app) as c:
        assert app.state.runtime.loaded.wait(30)
        response = c.get("/health")
        assert response.status_code == 503
        assert "not found" in response.json()["error"]
        assert post(c, TICKET).status_code == 503
        assert_unknown_models_are_404(c, "missing, jev-latest")


def assert_unknown_models_are_404(c: TestClient, known: str = "tiny-chat, jev-latest") -> None:
    """Every route that resolves a model name answers an unknown one 404, whatever the models' state."""
    unknown = body_with(model="nope")
    responses = {
        "request": post(c, unknown),
        "fitting": c.post("/v1/calibrations", json={"model": "nope", "examples": [{"state": "x", "questions": {}}]}),
        "fits": c.get("/v1/calibrations?model=nope"),
        "load": c.post("/v1/models/nope/load"),
        "unload": c.post("/v1/models/nope/unload"),
    }
    for route, response in responses.items():
        assert response.status_code == 404, route
        assert response.json()["detail"]["error_type"] == "model_not_found", route
        assert response.json()["detail"]["message"].endswith(f"known models: {known}"), route
    batch = post(c, {"requests": [unknown, {"state": "x"}]})
    assert batch.status_code == 200
    assert [result["error"]["status"] for result in batch.json()["results"]] == [404, 422]


def test_an_unknown_model_is_404_while_the_models_load(tiny_chat_path: Path) -> None:
    release = threading.Event()

    def slow_loader(settings: Settings) -> ModelRegistry:
        assert release.wait(60), "the test never let the model load"
        return ModelRegistry.serving(load_model(settings))

    app = create_app(tiny_settings(tiny_chat_path), loader=slow_loader)
    with TestClient(app) as c:
        assert_unknown_models_are_404(c)
        assert post(c, TICKET).status_code == 503  # a known name waits for its model
        assert post(c, {"requests": [TICKET]}).status_code == 503
        release.set()
        assert app.state.runtime.loaded.wait(30)
        assert_unknown_models_are_404(c)


def test_unknown_routes_and_methods_use_the_error_shape(client: TestClient) -> None:
    assert client.get("/nope").json()["detail"]["error_type"] == "not_found"
    wrong = client.get("/v1/systemone")
    assert wrong.status_code == 405 and wrong.json()["detail"]["error_type"] == "method_not_allowed"
    assert wrong.headers["allow"] == "POST"  # RFC 9110: a 405 names the methods the path has
    # a path served by a route per method: every one of them
    assert client.put("/v1/calibrations").headers["allow"] == "GET, HEAD, POST"
    assert client.post("/v1/systemone/jobs/x").headers["allow"] == "DELETE, GET, HEAD"


def test_answers_waiting_for_a_context_leave_the_threads_that_read_requests_free(
    client: TestClient, tiny_service: ModelService
) -> None:
    """Answers run on worker threads of their own: with every one of the threads that read bodies (anyio's
    default ones, down to one here) free, a request for an unknown model is read and answered 404 while
    an answer waits for the model's only context."""

    def one_reading_thread() -> None:
        anyio.to_thread.current_default_thread_limiter().total_tokens = 1

    client.portal.call(one_reading_thread)  # type: ignore[union-attr]  # the client's portal is open inside `with`
    holder = Borrower(tiny_service.engine)
    assert holder.got.wait(30)
    question = {"q": {"type": "noul", "instructions": "Is it answered?"}}
    body = {"model": "jev-latest", "state": "A state answered once the context is free.", "questions": question}
    got: list[Any] = []
    waiting = threading.Thread(target=lambda: got.append(client.post("/v1/systemone", json=body)), daemon=True)
    unknown: threading.Thread | None = None
    try:
        waiting.start()
        until(lambda: tiny_service.engine._pool.waiting("interactive") == 1, 30)
        unknown = threading.Thread(
            target=lambda: got.append(client.post("/v1/systemone", json={**body, "model": "gpt-5"})), daemon=True
        )
        unknown.start()
        unknown.join(30)
        assert not unknown.is_alive(), "a request for an unknown model waited for an answer's thread"
        assert [response.status_code for response in got] == [404]
    finally:
        holder.let_go()
        waiting.join(30)
        if unknown is not None:
            unknown.join(30)
    assert not waiting.is_alive() and got[-1].status_code == 200
