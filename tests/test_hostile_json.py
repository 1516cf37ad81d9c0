"""Hostile bodies get a 4xx in the contract's shape, never a 5xx, and never cost the connection."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from app.http.body import MAX_DEPTH

HEAD = b'{"model":"jev-latest","state":'
TAIL = b',"questions":{"q":{"type":"noul"}}}'
GOOD = {"model": "jev-latest", "state": "My order never arrived.", "questions": {"q": {"type": "noul"}}}


def body_with_state(state: bytes) -> bytes:
    return HEAD + state + TAIL


def nested(depth: int, open_: bytes, close: bytes) -> bytes:
    return open_ * depth + b"1" + close * depth


def deep_objects(depth: int) -> bytes:
    return b'{"k":' * depth + b"1" + b"}" * depth


def post_raw(client: TestClient, raw: bytes) -> Any:
    return client.post("/v1/systemone", content=raw, headers={"content-type": "application/json"})


def assert_422_in_shape(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 422, response.text
    details = response.json()["detail"]
    assert isinstance(details, list) and details
    for item in details:
        assert {"loc", "msg", "type", "input"} <= item.keys()
        assert item["loc"][0] == "body"
    return details


# Each: the raw body, and the type of the first error detail the server must answer with.
HOSTILE: dict[str, tuple[bytes, str]] = {
    "5000 nested arrays": (body_with_state(nested(5000, b"[", b"]")), "json_too_deep"),
    "5000 nested objects": (body_with_state(deep_objects(5000)), "json_too_deep"),
    "arrays one past the limit": (body_with_state(nested(MAX_DEPTH, b"[", b"]")), "json_too_deep"),
    "objects in a text field past the limit": (
        HEAD + b'"s","questions":{"q":{"type":"noul","instructions":' + deep_objects(MAX_DEPTH) + b"}}}",
        "json_too_deep",
    ),
    "lone surrogate in the state": (body_with_state(b'"a\\u0000b\\ud800"'), "string_unicode"),
    "low surrogate alone": (body_with_state(b'"\\udc00x"'), "string_unicode"),
    "reversed surrogate pair": (body_with_state(b'"\\udc00\\ud800"'), "string_unicode"),
    "surrogate in a nested state value": (body_with_state(b'{"a":["ok","\\ud83d"]}'), "string_unicode"),
    "surrogate in a state key": (body_with_state(b'{"\\ud800":1}'), "string_unicode"),
    "surrogate in an option name": (
        HEAD + b'"s","questions":{"q":{"type":"choice","criteria":{"\\ud800":null,"b":null}}}}',
        "string_unicode",
    ),
    "surrogate in a level description": (
        HEAD + b'"s","questions":{"q":{"type":"score","criteria":["low","\\udfff"]}}}',
        "string_unicode",
    ),
    "surrogate in instructions": (
        HEAD + b'"s","questions":{"q":{"type":"noul","instructions":"is it \\ud800?"}}}',
        "string_unicode",
    ),
    "surrogate in a question id": (HEAD + b'"s","questions":{"\\ud800":{"type":"noul"}}}', "string_unicode"),
    "surrogate in the model name": (b'{"model":"\\ud800","state":"s"' + TAIL, "string_unicode"),
    "1e999": (body_with_state(b"1e999"), "json_invalid"),
    "-1e999": (body_with_state(b"-1e999"), "json_invalid"),
    "1e999 nested": (body_with_state(b'{"price":[1.5,1e999]}'), "json_invalid"),
    "NaN": (body_with_state(b"NaN"), "json_invalid"),
    "Infinity": (body_with_state(b"Infinity"), "json_invalid"),
    "-Infinity": (body_with_state(b"-Infinity"), "json_invalid"),
    "a 10,000-digit integer": (body_with_state(b"9" * 10_000), "json_invalid"),
    "invalid UTF-8 inside a string": (body_with_state(b'"abc\xff\xfedef"'), "json_invalid"),
    "a truncated UTF-8 sequence": (body_with_state(b'"caf\xc3"'), "json_invalid"),
    "an overlong UTF-8 encoding": (body_with_state(b'"\xc0\xaf"'), "json_invalid"),
    # json.loads decodes bytes with "surrogatepass": encoded surrogates arrive as lone surrogates
    "UTF-8-encoded surrogate bytes": (body_with_state(b'"\xed\xa0\x80"'), "string_unicode"),
    "a bare string": (b'"hello"', "model_type"),
    "a bare number": (b"42", "model_type"),
    "a bare null": (b"null", "model_type"),
    "a bare array": (b"[1,2]", "model_type"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_bodies_are_422_in_the_contract_shape(client: TestClient, name: str) -> None:
    raw, error_type = HOSTILE[name]
    details = assert_422_in_shape(post_raw(client, raw))
    assert details[0]["type"] == error_type, details


def test_the_error_points_at_the_field_that_holds_the_surrogate(client: TestClient) -> None:
    raw = HEAD + b'{"a":["ok","\\ud83d"]}' + TAIL
    assert assert_422_in_shape(post_raw(client, raw))[0]["loc"] == ["body", "state", "a", 1]
    raw = HEAD + b'"s","questions":{"q":{"type":"choice","criteria":{"\\ud800":null,"b":null}}}}'
    assert assert_422_in_shape(post_raw(client, raw))[0]["loc"] == ["body", "questions", "q", "criteria", "\\ud800"]


@pytest.mark.parametrize(
    "state",
    [
        b"NaN",
        b'["NaN", NaN]',  # the same word in a string first
        b'{"price":[1.5,1e999]}',
        b'["-Infinity", -Infinity]',
        b"9" * 5000,
        '["\u00e9t\u00e9", 1e999]'.encode(),  # two bytes a letter before it: the place counts letters
    ],
)
def test_a_refused_number_or_constant_is_reported_where_it_stands(client: TestClient, state: bytes) -> None:
    raw = body_with_state(state)
    token = state.decode().rsplit(" ", 1)[-1].rsplit(",", 1)[-1].rstrip("]}")
    (detail,) = assert_422_in_shape(post_raw(client, raw))
    # counted in characters of the decoded text, as a JSON syntax error's place is
    assert detail["type"] == "json_invalid" and detail["loc"] == ["body", raw.decode().rindex(token)]


def test_nesting_up_to_the_limit_is_answered(client: TestClient) -> None:
    # the body object is level 1, so a state of MAX_DEPTH - 1 levels is the deepest allowed
    assert post_raw(client, body_with_state(nested(MAX_DEPTH - 1, b"[", b"]"))).status_code == 200
    assert post_raw(client, body_with_state(deep_objects(MAX_DEPTH - 1))).status_code == 200


@pytest.mark.parametrize(
    "raw",
    [
        b"\xef\xbb\xbf" + json.dumps(GOOD).encode(),  # a UTF-8 BOM, which RFC 8259 lets a parser ignore
        body_with_state(b'"a\\u0000b"'),  # NUL is a valid character; the tokenizer takes it as bytes
        body_with_state(b'"\\ud83d\\ude00 a proper surrogate pair"'),  # one emoji, valid UTF-16 escapes
        body_with_state(b'{"n":1' + b"0" * 4000 + b"}"),  # a big integer Python can still convert
        body_with_state(b'{"n":1e308}'),  # large, finite
    ],
)
def test_unusual_but_valid_bodies_are_answered(client: TestClient, raw: bytes) -> None:
    response = post_raw(client, raw)
    assert response.status_code == 200, response.text
    assert 0.0 <= response.json()["answers"]["q"]["noul"] <= 1.0


text_fields = st.sampled_from(["state", "instructions", "option", "level", "id"])


def body_with_text(field: str, text: str) -> dict[str, Any]:
    question: dict[str, Any] = {"type": "noul"}
    if field == "instructions":
        question["instructions"] = text
    elif field == "option":
        question = {"type": "choice", "criteria": {text: None, "zzz-other": "x"}}
    elif field == "level":
        question = {"type": "score", "criteria": ["low", text]}
    qid = text if field == "id" else "q"
    return {"model": "jev-latest", "state": text if field == "state" else "s", "questions": {qid: question}}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    field=text_fields,
    text=st.text(st.characters() | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=40),
)
def test_generated_hostile_strings_never_get_a_5xx(client: TestClient, field: str, text: str) -> None:
    # json.dumps escapes lone surrogates as \\udXXX, exactly what a buggy client sends
    raw = json.dumps(body_with_text(field, text)).encode()
    response = post_raw(client, raw)
    assert response.status_code in (200, 422), response.text
    if response.status_code == 422:
        assert_422_in_shape(response)
    has_surrogate = any(0xD800 <= ord(c) <= 0xDFFF for c in text)
    if has_surrogate:
        assert response.json()["detail"][0]["type"] == "string_unicode"


def test_a_keep_alive_connection_answers_a_good_request_after_each_bad_one(live_url: str) -> None:
    host, port = live_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.connect()
    first_socket = connection.sock
    try:
        for raw, _ in HOSTILE.values():
            connection.request("POST", "/v1/systemone", body=raw, headers={"Content-Type": "application/json"})
            bad = connection.getresponse()
            assert bad.status == 422 and bad.getheader("connection") != "close"
            bad.read()
            connection.request(
                "POST", "/v1/systemone", body=json.dumps(GOOD), headers={"Content-Type": "application/json"}
            )
            good = connection.getresponse()
            assert good.status == 200
            good.read()
            assert connection.sock is first_socket  # http.client reconnects silently: this says it did not
    finally:
        connection.close()
