"""Images in hostile bodies: generated multipart bodies and assets get a 4xx in the contract's shape,
never a 5xx, and the server answers the next request on the same connection."""

from __future__ import annotations

import base64
import http.client
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from app.platform.tiny_images import png
from tests.support.image_files import bomb_png, jpeg, webp
from tests.support.image_requests import HOSTILE, asked, multipart

SEEDS = [png(2, 2), png(3, 1, colour=6), jpeg(8, 8), bomb_png(5000, 5000), webp(), b"", b"\x89PNG\r\n\x1a\n"]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def assert_4xx_in_shape(response: Any) -> None:
    assert 400 <= response.status_code < 500, response.text
    detail = response.json()["detail"]
    if response.status_code == 422:
        assert isinstance(detail, list) and detail
        assert all({"loc", "msg", "type", "input"} <= item.keys() and item["loc"][0] == "body" for item in detail)
    else:
        assert set(detail) == {"error_type", "message"}


@st.composite
def changed(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` with a few bytes changed, cut, or put in."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, max(len(out) - 1, 0)))
        action = draw(st.sampled_from(["set", "cut", "insert"]))
        if action == "set" and out:
            out[at] = draw(st.integers(0, 255))
        elif action == "cut":
            del out[at : at + draw(st.integers(1, 40))]
        else:
            out[at:at] = draw(st.sampled_from([b"\r\n", b"--", b'"', b";", b"\r\n\r\n", b"\x00", b"name="]))
    return bytes(out)


@FUZZ
@given(data=st.data())
def test_changed_sdk_multipart_bodies_get_a_4xx(client: TestClient, data: st.DataObject) -> None:
    image = data.draw(st.sampled_from(SEEDS))
    content_type, raw = multipart(asked(assets={"<a>": {"type": "image", "part": "asset-0"}}), {"asset-0": image})
    body = data.draw(changed(raw))
    boundary = content_type.partition("boundary=")[2]
    content_type = data.draw(
        st.sampled_from(
            [
                content_type,
                f'Multipart/Form-Data; boundary="{boundary}"',
                f"multipart/form-data; boundary={boundary[:-1]}",
                "multipart/form-data",
                "multipart/form-data; boundary=",
                "multipart/form-data; boundary=" + "x" * 71,
                "application/json",
            ]
        )
    )
    response = client.post("/v1/systemone", content=body, headers={"content-type": content_type})
    if response.status_code != 200:  # a change may leave a valid request with no image: it is answered
        assert_4xx_in_shape(response)


texts = st.text(max_size=12)
asset_values = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["image", "video"]) | texts,
        "format": st.sampled_from(["png", "jpg", "jpeg", "webp"]) | st.none(),
        "data_base64": st.sampled_from([base64.b64encode(s).decode() for s in SEEDS]) | texts | st.none(),
        "part": st.sampled_from(["asset-0", "request", ""]) | texts,
    },
)
json_values = st.recursive(st.none() | st.booleans() | st.integers() | texts, lambda inner: st.lists(inner, max_size=3))


@FUZZ
@given(
    assets=st.dictionaries(st.sampled_from(["<a>", "<b>", "", "a"]) | texts, asset_values | json_values, max_size=10)
    | json_values,
    images=st.lists(
        st.sampled_from([f"data:image/png;base64,{base64.b64encode(png()).decode()}", "data:", ","]) | texts
    )
    | json_values,
    state=st.sampled_from(["<a> <b>", "a", [{"content": [{"type": "image_url", "image_url": {"url": "data:x"}}]}]]),
)
def test_generated_assets_and_images_never_get_a_5xx(client: TestClient, assets: Any, images: Any, state: Any) -> None:
    response = client.post("/v1/systemone", json=asked(state, assets=assets, images=images))
    if response.status_code != 200:
        assert_4xx_in_shape(response)


def test_a_keep_alive_connection_answers_a_good_request_after_each_hostile_image(live_url: str) -> None:
    host, port = live_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.connect()
    first_socket = connection.sock
    good = json.dumps(asked("plain text"))
    try:
        for payload, parts, _ in HOSTILE.values():
            if parts is None:
                content_type, raw = "application/json", json.dumps(payload).encode()
            else:
                content_type, raw = multipart(payload, parts)
            connection.request("POST", "/v1/systemone", body=raw, headers={"Content-Type": content_type})
            bad = connection.getresponse()
            assert bad.status == 422 and bad.getheader("connection") != "close"
            bad.read()
            connection.request("POST", "/v1/systemone", body=good, headers={"Content-Type": "application/json"})
            answered = connection.getresponse()
            assert answered.status == 200
            answered.read()
            assert connection.sock is first_socket
    finally:
        connection.close()
