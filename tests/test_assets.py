"""app/wire/assets.py: every way a client sends an image reads to the same images, in prompt order, with the
texts keeping their placeholders; and the routing key and the vision refusal that follow from them."""

from __future__ import annotations

import base64
import hashlib
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from app.errors import InvalidRequest
from app.fleet.routing import affinity_key, affinity_key_of
from app.http.runtime import Runtime
from app.platform.tiny_images import png
from app.serving.catalogue import models_listing
from app.serving.registry import ModelRegistry
from app.serving.specs import ModelsConfig, ModelSpec
from app.wire.assets import request_of
from app.wire.contract import SystemOneRequest
from app.wire.images import IMAGES_BODY_BYTES, MAX_BASE64_CHARS, MAX_IMAGES, Image, read_image
from tests.support.image_files import jpeg
from tests.support.settings import isolated_settings

RED, PHOTO = png(2, 2, seed=3), jpeg(8, 6)
QUESTION = {"q": {"type": "noul", "instructions": "Is it red?"}}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64,{b64(data)}"


def asked(state: Any = "look", questions: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    return {"model": "m", "state": state, "questions": questions or QUESTION, **fields}


def asset(data: bytes, kind: str = "png") -> dict[str, str]:
    return {"type": "image", "format": kind, "data_base64": b64(data)}


def images_of(request: SystemOneRequest) -> list[Image]:
    return list(request.media.images)


# The same two images, a PNG then a JPEG, before a state that says "compare", in every form.
FORMS: dict[str, tuple[dict[str, Any], dict[str, bytes]]] = {
    "images": (asked("compare", images=[url(RED), url(PHOTO, "jpeg")]), {}),
    "files": (asked("compare", files=[url(RED), url(PHOTO, "jpeg")]), {}),
    "files then images": (asked("compare", files=[url(RED)], images=[url(PHOTO, "jpeg")]), {}),
    "image_url parts": (
        asked(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": url(RED)}},
                        {"type": "image_url", "image_url": url(PHOTO, "jpeg")},  # the bare form llama.cpp takes too
                        {"type": "text", "text": "compare"},
                    ],
                }
            ]
        ),
        {},
    ),
    "data_base64 assets": (asked("<a> <b> compare", assets={"<b>": asset(PHOTO, "jpg"), "<a>": asset(RED)}), {}),
    "multipart assets": (
        asked("<a> <b> compare", assets={"<a>": {"type": "image", "part": "asset-0"}, "<b>": {"part": "p"}}),
        {"asset-0": RED, "p": PHOTO},
    ),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_every_form_reads_to_the_same_images_in_the_same_order(form: str) -> None:
    payload, parts = FORMS[form]
    request = request_of(payload, parts)
    assert images_of(request) == [read_image(RED), read_image(PHOTO)]
    assert [(i.format, i.width, i.height) for i in request.media.images] == [("png", 2, 2), ("jpeg", 8, 6)]
    assert request.media.images[0].sha256 == hashlib.sha256(RED).hexdigest()
    assert (request.assets, request.images, request.files) == (None, None, None)  # read into media


def test_image_parts_are_taken_out_of_the_state_as_llama_cpp_does() -> None:
    request = request_of(FORMS["image_url parts"][0])
    assert request.state == [{"role": "user", "content": [{"type": "text", "text": "compare"}]}]
    assert request.media.fields == ("state",)
    wrapped = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url(RED)}}]}]}
    request = request_of(asked({**wrapped, "meta": 1}))
    assert request.state == {"messages": [{"role": "user", "content": []}], "meta": 1}
    assert images_of(request) == [read_image(RED)]


def test_llama_cpp_forms_come_first_then_assets_as_first_found_in_the_texts() -> None:
    questions = {
        "q2": {"type": "choice", "instructions": "like <c>?", "criteria": {"<d>": None, "no": "not <b>"}},
        "q1": {"type": "noul", "instructions": "<b> again"},
    }
    assets = {name: asset(png(1, 1, seed=i)) for i, name in enumerate(["<d>", "<c>", "<b>", "<a>"])}
    state = {"z": "<a>", "y": ["<b>", "<a>"]}  # the prompt renders "y" before "z"
    request = request_of(asked(state, questions, assets=assets, images=[url(PHOTO, "jpeg")]))
    order = [PHOTO, png(1, 1, seed=2), png(1, 1, seed=3), png(1, 1, seed=1), png(1, 1, seed=0)]  # photo, b, a, c, d
    assert [image.data for image in request.media.images] == order
    assert dict(request.media.placeholders) == {"<b>": 1, "<a>": 2, "<c>": 3, "<d>": 4}
    assert request.media.fields == ("images", "assets")


def test_a_placeholder_is_rendered_as_the_prompter_asks_wherever_it_is() -> None:
    request = request_of(
        asked({"note": "<x> then <x>", "<x>": "<y>"}, assets={"<x>": asset(RED), "<y>": asset(PHOTO, "jpeg")})
    )
    assert request.state_text == '{"<x>":"<y>","note":"<x> then <x>"}'  # placeholders kept
    marked = request.render(request.state, lambda i: f"<__media_{i}__>")
    # the images in the order the prompt renders the state: its keys sorted, "<x>" before "note"
    assert dict(request.media.placeholders) == {"<y>": 0, "<x>": 1}
    assert marked == '{"<x>":"<__media_0__>","note":"<__media_1__> then <__media_1__>"}'
    assert request.render("no image here", lambda i: "!") == "no image here"


def test_a_placeholder_without_an_asset_is_plain_text() -> None:
    text = "<image:00000000000000000000000000000001>"
    request = request_of(asked(text))
    assert request.media.images == () and request.state_text == text


def test_the_same_image_under_two_placeholders_is_two_images_and_one_placeholder_used_twice_is_one() -> None:
    request = request_of(asked("<a> <b> <a>", assets={"<a>": asset(RED), "<b>": asset(RED)}))
    assert images_of(request) == [read_image(RED)] * 2


def test_at_most_8_images_counted_over_every_form() -> None:
    assets = {f"<{i}>": asset(RED) for i in range(4)}
    request_of(asked(" ".join(assets), assets=assets, images=[url(RED)] * 4))
    with pytest.raises(InvalidRequest) as raised:
        request_of(asked(" ".join(assets), assets=assets, images=[url(RED)] * 5))
    assert raised.value.details == [
        {"loc": ["body", "assets", "<3>"], "msg": "9 images; a request takes at most 8", "type": "too_long", "input": 9}
    ]
    assert MAX_IMAGES == 8


def test_the_routing_key_covers_the_images_in_order_and_is_unchanged_without_them() -> None:
    two = request_of(FORMS["images"][0])
    swapped = request_of(asked("compare", images=[url(PHOTO, "jpeg"), url(RED)]))
    assert affinity_key_of("compare") == affinity_key("compare")
    keys = {affinity_key_of("compare"), affinity_key_of("compare", two.media.images)}
    keys.add(affinity_key_of(swapped.state_text, swapped.media.images))
    keys.add(affinity_key_of("compare", [read_image(png(2, 2, seed=4)), read_image(PHOTO)]))  # another first image
    assert len(keys) == 4


def registry_of(*names: str) -> ModelRegistry:
    """Models named "eyes..." take images: a vision projector is set for them."""
    specs = tuple(
        ModelSpec(
            name,
            Path(f"{name}.gguf"),
            settings=isolated_settings(mmproj=Path("p.gguf") if name.startswith("eyes") else None),
        )
        for name in names
    )
    return ModelRegistry(ModelsConfig(specs, names[0], 1), loader=lambda spec: pytest.fail("nothing loads"))


def refusal(registry: ModelRegistry, payload: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(InvalidRequest) as raised:
        registry.check("jev-latest", request_of(payload))
    [detail] = raised.value.details
    return detail


def test_images_to_a_model_without_vision_get_a_422_naming_the_models_that_have_it() -> None:
    payload = asked("<a>", assets={"<a>": asset(RED)})
    assert refusal(registry_of("text", "eyes-1", "eyes-2"), payload) == {
        "loc": ["body", "assets"],
        "msg": "image assets need a vision model; 'text' has no vision projector, and the models here that do: "
        "eyes-1, eyes-2",
        "type": "images_unsupported",
        "input": 1,
    }
    registry_of("eyes-1", "text").check("jev-latest", request_of(payload))  # no 422 for a vision model
    registry_of("text").check("jev-latest", request_of(asked("no images")))


def test_without_a_vision_model_the_refusal_says_none_takes_images() -> None:
    detail = refusal(registry_of("tiny"), asked("hi", images=[url(RED)]))
    assert detail["loc"] == ["body", "images"]
    assert detail["msg"] == (
        "image assets need a vision model; 'tiny' has no vision projector, and no model here takes images"
    )


def test_the_body_bound_grows_by_8_images_of_base64_where_a_model_takes_images() -> None:
    runtime = Runtime(isolated_settings(), registry=registry_of("text"))
    assert runtime.body_limit() == runtime.settings.max_body_bytes
    runtime.registry = registry_of("text", "eyes")
    assert runtime.body_limit() == runtime.settings.max_body_bytes + IMAGES_BODY_BYTES
    assert IMAGES_BODY_BYTES == 8 * 4 * ((10 * 1024 * 1024 + 2) // 3)


def test_models_lists_which_models_take_images() -> None:
    listing = models_listing(registry_of("text", "eyes").catalogue())
    assert {m["name"]: m["x_takes_images"] for m in listing["models"]} == {
        "text": False,
        "eyes": True,
        "jev-latest": False,
    }
    assert [d["x_takes_images"] for d in listing["data"]] == [False, True, False]
    assert listing["models"][1]["x_mmproj"] == "p.gguf"


def test_ten_thousand_assets_are_refused_by_their_count_before_any_is_read_or_text_searched() -> None:
    assets = {f"<{i}>": asset(RED) for i in range(10_000)}
    with pytest.raises(InvalidRequest) as raised:
        request_of(asked(" ".join(assets), assets=assets))
    assert raised.value.details == [
        {
            "loc": ["body", "assets", "<8>"],
            "msg": "10000 images; a request takes at most 8",
            "type": "too_long",
            "input": 10_000,
        }
    ]


def test_more_images_than_a_request_takes_are_counted_before_placeholders_are_looked_for() -> None:
    assets = {f"<{i}>": asset(RED) for i in range(MAX_IMAGES)}  # found nowhere: not searched for
    with pytest.raises(InvalidRequest) as raised:
        request_of(asked("no placeholder here", assets=assets, images=[url(RED)]))
    assert raised.value.details == [
        {"loc": ["body", "assets", "<7>"], "msg": "9 images; a request takes at most 8", "type": "too_long", "input": 9}
    ]


@pytest.mark.parametrize("field", ["assets", "images"])
def test_whitespace_padded_base64_is_refused_without_splitting_it(field: str) -> None:
    padded = "ab " * (MAX_BASE64_CHARS // 2)  # over the limit only with its whitespace
    body = asked("<a>", assets={"<a>": {"format": "png", "data_base64": padded}})
    if field == "images":
        body = asked("look", images=["data:image/png;base64," + padded])
    tracemalloc.start()
    try:
        with pytest.raises(InvalidRequest) as raised:
            request_of(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [d["type"] for d in raised.value.details] == ["image_too_large"]
    # at most one copy of it (a data URL is cut at its comma); split, it made a string of every piece
    assert peak < 1.5 * len(padded)


def test_base64_wrapped_in_lines_within_the_room_for_them_is_read_and_stripped_in_one_copy() -> None:
    lines = b64(RED)
    wrapped = "\r\n".join(lines[i : i + 4] for i in range(0, len(lines), 4))
    assert images_of(request_of(asked("<a>", assets={"<a>": {"format": "png", "data_base64": wrapped}}))) == [
        read_image(RED)
    ]
    most = MAX_BASE64_CHARS + 1  # one character too many, wrapped as MIME wraps it
    text = "\r\n".join("A" * 76 for _ in range(most // 76)) + "\r\n" + "A" * (most % 76)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidRequest) as raised:
            request_of(asked("<a>", assets={"<a>": {"format": "png", "data_base64": text}}))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert raised.value.details[0]["msg"] == f"the image's base64 is {most} characters; the limit is {MAX_BASE64_CHARS}"
    assert peak < 1.5 * len(text)  # the text without its whitespace, once
