"""Images over HTTP, against the real app on the tiny model (which has no vision projector): a valid
image, in every form a client sends one, reaches the vision 422; each hostile input gets its own 4xx,
named exactly; a box question is refused as such; the Danger Zone headers are taken and not needed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from backports.zstd import compress as zstd_compress
from backports.zstd import decompress as zstd_decompress
from starlette.testclient import TestClient
from typesafe_sdk import Image as SdkImage
from typesafe_sdk import Noul, RetryPolicy, TypeSafeClient, TypeSafeUnprocessableEntityError

from app.answering.service import ModelService
from app.http.server import create_app
from app.platform.tiny_images import png
from app.serving.registry import ModelRegistry
from app.wire.images import MAX_BASE64_CHARS, MAX_IMAGE_BYTES
from tests.support.image_requests import (
    HOSTILE,
    ONE_PLACEHOLDER,
    PHOTO,
    RED,
    asked,
    asset,
    multipart,
    part_asset,
    problem,
    url,
)
from tests.support.settings import tiny_settings

BIG = png(40, 30, seed=5)  # over the SDK's 1024-byte threshold once in a body: compressed
NO_VISION = "image assets need a vision model; 'tiny-chat' has no vision projector, and no model here takes images"


def send(client: TestClient, payload: Any, parts: dict[str, bytes] | None = None, encoding: str = "") -> Any:
    if parts is None:
        content_type, raw = "application/json", json.dumps(payload).encode()
    else:
        content_type, raw = multipart(payload, parts)
    headers = {"content-type": content_type}
    if encoding:
        headers["content-encoding"] = encoding
        raw = zstd_compress(raw) if encoding == "zstd" else gzip.compress(raw)
    return client.post("/v1/systemone", content=raw, headers=headers)


def detail_of(response: Any, status: int = 422) -> Any:
    assert response.status_code == status, response.text
    return response.json()["detail"]


def vision_refusal(loc: list[Any], count: int = 1) -> list[dict[str, Any]]:
    return [{"loc": loc, "msg": NO_VISION, "type": "images_unsupported", "input": count}]


FORMS: dict[str, tuple[Any, dict[str, bytes] | None, str, list[Any]]] = {
    "json data_base64": (asked(assets={"<a>": asset(RED)}), None, "", ["body", "assets"]),
    "json data_base64, zstd": (asked(assets={"<a>": asset(BIG)}), None, "zstd", ["body", "assets"]),
    "multipart": (asked(assets={"<a>": part_asset()}), {"asset-0": RED}, "", ["body", "assets"]),
    "multipart, zstd": (asked(assets={"<a>": part_asset()}), {"asset-0": BIG}, "zstd", ["body", "assets"]),
    "multipart, gzip": (asked(assets={"<a>": part_asset()}), {"asset-0": BIG}, "gzip", ["body", "assets"]),
    "llama.cpp images": (asked("look", images=[url(RED), url(PHOTO, "jpeg")]), None, "", ["body", "images"]),
    "llama.cpp files": (asked("look", files=[url(PHOTO, "jpeg")]), None, "", ["body", "files"]),
    "llama.cpp image_url parts": (
        asked([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url(RED)}}]}]),
        None,
        "",
        ["body", "state"],
    ),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_a_valid_image_in_every_form_reaches_the_vision_422(client: TestClient, form: str) -> None:
    payload, parts, encoding, loc = FORMS[form]
    count = len(payload.get("images", [])) or 1
    assert detail_of(send(client, payload, parts, encoding)) == vision_refusal(loc, count)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_image_request_gets_its_own_422(client: TestClient, name: str) -> None:
    payload, parts, expected = HOSTILE[name]
    assert detail_of(send(client, payload, parts)) == expected


WRONG_FORMAT = {"<a>": {"format": "webp", "data_base64": "AAAA"}}


@pytest.mark.parametrize(
    ("payload", "loc", "kind"),
    [
        (asked(assets={}), ["body", "assets"], "too_short"),
        (asked(assets=[{"url": "x"}]), ["body", "assets"], "dict_type"),
        (asked(assets={"<a>": {"type": "video"}}), ["body", "assets", "<a>", "type"], "literal_error"),
        (asked(assets=WRONG_FORMAT), ["body", "assets", "<a>", "format"], "literal_error"),
        (asked("x", images="data:image/png;base64,AAAA"), ["body", "images"], "list_type"),
    ],
)
def test_assets_and_images_of_the_wrong_shape_get_pydantics_422(
    client: TestClient, payload: Any, loc: list[Any], kind: str
) -> None:
    [detail] = detail_of(send(client, payload))
    assert (detail["loc"], detail["type"]) == (loc, kind)


def test_an_image_over_the_byte_bound_is_refused_where_the_body_may_hold_it(
    tiny_service: ModelService, tiny_chat_path: Path
) -> None:
    settings = tiny_settings(tiny_chat_path, max_body_bytes=64 * 1024 * 1024)
    with TestClient(create_app(settings, registry=ModelRegistry.serving(tiny_service))) as roomy:
        big = RED + bytes(MAX_IMAGE_BYTES)
        message = f"the image is {len(big)} bytes; the limit is {MAX_IMAGE_BYTES}"
        part = detail_of(send(roomy, ONE_PLACEHOLDER, {"asset-0": big}))
        assert part == problem(["assets", "<a>"], "the part 'asset-0': " + message, "image_too_large")
        text = "A" * (MAX_BASE64_CHARS + 4)
        encoded = detail_of(send(roomy, asked(assets={"<a>": {"format": "png", "data_base64": text}})))
        message = f"the image's base64 is {len(text)} characters; the limit is {MAX_BASE64_CHARS}"
        assert encoded == problem(["assets", "<a>"], message, "image_too_large")


def test_a_server_without_a_vision_model_keeps_its_body_bound(client: TestClient) -> None:
    big = bytes(9 * 1024 * 1024)  # over max_body_bytes (8 MiB), which no vision model raises
    response = send(client, ONE_PLACEHOLDER, {"asset-0": big})
    assert detail_of(response, 413)["error_type"] == "request_too_large"


def test_a_malformed_multipart_body_and_a_batch_with_parts_get_422(client: TestClient) -> None:
    content_type, raw = multipart(asked(), {"asset-0": RED})
    bad = client.post(
        "/v1/systemone", content=raw.replace(b'name="request"', b'name="req"'), headers={"content-type": content_type}
    )
    assert detail_of(bad) == problem([], "no part is named 'request': it holds the JSON body", "multipart_invalid")
    batch = send(client, {"requests": [asked(assets={"<a>": part_asset()})]}, {"asset-0": RED})
    message = "a batch's images come as data_base64 or data URLs, not as parts of a multipart body"
    assert detail_of(batch) == problem(["requests"], message, "multipart_invalid")


def test_a_batch_request_with_an_image_gets_the_vision_422_as_its_result(client: TestClient) -> None:
    batch = {"requests": [asked(assets={"<a>": asset(RED)}), asked("plain text")]}
    results = send(client, batch).json()["results"]
    assert results[0] == {"error": {"status": 422, "detail": vision_refusal(["body", "assets"])}}
    assert results[1]["answers"]["q"]["type"] == "noul"


def test_a_box_question_is_refused_naming_the_missing_head(client: TestClient) -> None:
    box = {"type": "box", "instructions": "the dog"}
    payload = {"model": "jev-latest", "state": "x", "questions": {"where": box, "q": {"type": "maybe"}}}
    details = detail_of(send(client, payload))
    assert details[0] == {
        "loc": ["body", "questions", "where"],
        "msg": "onepass has no box head: no model here reads a box; ask a noul, choice or score question",
        "type": "box_unsupported",
        "input": box,
    }
    assert details[1]["type"] == "union_tag_invalid"  # any other type is refused as before


DANGER = {"TypeSafe-Danger-Zone-Images": "true", "typesafe-danger-zone-long-context": "true"}


def test_the_danger_zone_headers_are_taken_and_not_needed(client: TestClient) -> None:
    for headers in (DANGER, {}):
        answered = client.post("/v1/systemone", json=asked("plain text"), headers=headers)
        assert answered.status_code == 200, answered.text
        refused = client.post("/v1/systemone", json=asked(assets={"<a>": asset(RED)}), headers=headers)
        assert detail_of(refused) == vision_refusal(["body", "assets"])


def test_a_placeholder_without_an_asset_is_answered_as_text(client: TestClient) -> None:
    assert send(client, asked("<image:00000000000000000000000000000001>")).status_code == 200


# The official SDK ---------------------------------------------------------------------------------


@pytest.fixture
def sent() -> list[httpx2.Request]:
    return []


def sdk(live_url: str, sent: list[httpx2.Request], compression: Any) -> TypeSafeClient:
    recorder = httpx2.Client(timeout=60.0, event_hooks={"request": [sent.append]})
    return TypeSafeClient(
        api_key="unused",
        base_url=live_url,
        retry=RetryPolicy(max_retries=0),
        http_client=recorder,
        compression=compression,
    )


def body_sent(request: httpx2.Request) -> bytes:
    content = request.content
    return zstd_decompress(content) if request.headers.get("content-encoding") == "zstd" else content


@pytest.mark.parametrize(("image", "compression"), [(RED, False), (BIG, "zstd")], ids=["plain", "zstd"])
def test_the_sdk_sends_an_image_as_multipart_and_gets_the_vision_422(
    live_url: str, sent: list[httpx2.Request], image: bytes, compression: Any
) -> None:
    photo = SdkImage(image)
    with sdk(live_url, sent, compression) as client, pytest.raises(TypeSafeUnprocessableEntityError) as raised:
        client.system_one(state=photo, questions={"q": Noul(instructions=f"Is {photo} red?")}, extra_headers=DANGER)
    assert raised.value.body == {"detail": vision_refusal(["body", "assets"])}
    [request] = sent
    assert request.headers["content-type"].startswith("multipart/form-data; boundary=")
    assert request.headers.get("content-encoding") == ("zstd" if compression else None)
    reference = str(photo)
    assert json.dumps(reference).encode() in body_sent(request) and image in body_sent(request)


def test_the_sdk_sends_json_assets_as_they_are_and_gets_the_vision_422(
    live_url: str, sent: list[httpx2.Request]
) -> None:
    assets = {"<a>": asset(BIG)}
    with sdk(live_url, sent, "zstd") as client, pytest.raises(TypeSafeUnprocessableEntityError) as raised:
        client.system_one(state="<a>", questions={"q": Noul(instructions="Is it red?")}, extra_body={"assets": assets})
    assert raised.value.body == {"detail": vision_refusal(["body", "assets"])}
    [request] = sent
    assert request.headers["content-type"] == "application/json"
    assert json.loads(body_sent(request))["assets"] == assets


def test_the_sdk_with_nine_images_gets_the_limit(live_url: str, sent: list[httpx2.Request]) -> None:
    photos = [SdkImage(png(3, 3, seed=i)) for i in range(9)]
    with sdk(live_url, sent, False) as client, pytest.raises(TypeSafeUnprocessableEntityError) as raised:
        client.system_one(state=list(photos), questions={"q": Noul(instructions="Is it red?")})
    [detail] = raised.value.body["detail"]
    assert (detail["type"], detail["msg"]) == ("too_long", "more than 9 parts: a request part and at most 8 images")
