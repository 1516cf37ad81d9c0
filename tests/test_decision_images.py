"""Images in a decision GGUF's prompt, on the session cache, against real llama.cpp: the types llama.cpp
gives images take them through HTTP (llama.cpp's `images` data URLs), a repeated image state is a hit
bit for bit as the miss and as cache off that runs no encoder, each image of a state has a snapshot of
its own, and what llama.cpp refuses is a 422 that says why. (tests/test_native_server.py compares
the answers with llama-server's.)"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.platform.tiny_projector import Projector
from tests.support.decision_cases import QUESTIONS, TEMPLATES, decision_gguf
from tests.support.tiny_decision import BUILDERS
from tests.support.vision_decision import mmproj, photo, vision_decision_gguf, with_images
from tests.support.vision_serving import NAME, encodes, numbers, served

STATE = "The paper on the table."


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("decision-images")


def ask(client: TestClient, images: list[bytes], form: str = "images") -> dict[str, Any]:
    response = client.post("/v1/systemone", json={"model": NAME, **with_images(STATE, QUESTIONS, images, form)})
    assert response.status_code == 200, response.text
    answered: dict[str, Any] = response.json()
    return answered


@pytest.mark.parametrize(
    ("kind", "projector"), [("openjev", "mlp"), ("pplx-decider", "qwen2vl_merger"), ("lfm2-d1", "gemma3")]
)
def test_a_repeated_image_state_is_a_hit_that_runs_no_encoder_bit_for_bit(
    folder: Path, kind: str, projector: Projector
) -> None:
    model, projector_file = vision_decision_gguf(folder, kind, projector), mmproj(folder, projector)
    images = [photo(1), photo(2)]
    with served(model, projector_file, session_cache_entries=0, calibration="none") as (client, _):
        reference = ask(client, images)
    with served(model, projector_file, calibration="none") as (client, service):
        missed, hit = ask(client, images), ask(client, images)
        assert (reference["x_cache"], missed["x_cache"], hit["x_cache"]) == ("off", "miss", "hit")
        assert encodes(service) == 2  # the hit restored both images' cells
        assert numbers(hit) == numbers(missed) == numbers(reference)
        # the same images as chat-message parts: another state (a JSON one), the same images
        assert ask(client, images, "parts")["x_cache"] == "miss"


def test_each_image_state_keeps_a_snapshot_of_its_own(folder: Path) -> None:
    """Two images of one shape (the same cells, the same tokens around them) about the same text are
    two states: asked in turn, each is a hit the second time, answered as it was alone."""
    model, projector = vision_decision_gguf(folder, "openjev", "mlp"), mmproj(folder, "mlp")
    first, second = [photo(3)], [photo(4)]
    with served(model, projector, session_cache_entries=0, calibration="none") as (client, _):
        alone = numbers(ask(client, second))
    with served(model, projector, calibration="none") as (client, _):
        found = [ask(client, images) for images in (first, second, first, second)]
        assert [a["x_cache"] for a in found] == ["miss", "miss", "hit", "hit"]
        assert numbers(found[1]) == numbers(found[3]) == alone != numbers(found[0])


def refused(model: Path, projector: Path, form: str = "images") -> list[dict[str, Any]]:
    """The 422's details for a request with one image."""
    with served(model, projector, calibration="none") as (client, _):
        body = {"model": NAME, **with_images(STATE, QUESTIONS, [photo(1)], form)}
        response = client.post("/v1/systemone", json=body)
        assert response.status_code == 422
        detail: list[dict[str, Any]] = response.json()["detail"]
        return detail


def test_a_type_llama_cpp_gives_no_images_refuses_them_saying_which_do(folder: Path) -> None:
    detail = refused(decision_gguf(folder, "lev", TEMPLATES["lev"]), mmproj(folder, "mlp"))
    assert [(d["loc"], d["type"]) for d in detail] == [(["body", "images"], "images_unsupported")]
    assert "llama.cpp gives a lev decision model no images" in detail[0]["msg"]
    assert "openjev, clef, pplx-decider, lfm2-d1, lfm2-d1-omni" in detail[0]["msg"]


def test_a_template_that_puts_no_image_in_its_prompt_is_a_422(folder: Path) -> None:
    """llama.cpp's libmtmd refuses an image its prompt has no marker for; so does onepass, at the images."""
    detail = refused(decision_gguf(folder, "openjev", TEMPLATES["openjev"]), mmproj(folder, "mlp"))
    assert [d["loc"] for d in detail] == [["body", "images"]]
    assert "template put 0 of the request's 1 images in its prompt" in detail[0]["msg"]


@pytest.mark.parametrize("kind", ["clef", "lfm2-d1-omni"])
def test_a_type_read_whole_takes_images_in_its_one_batch_each_time(folder: Path, kind: str) -> None:
    """clef and lfm2-d1-omni keep no memory: each request encodes its images again and reads them
    in the batch of its prompt, answering the same numbers each time; the image moves the answers."""
    model, projector = vision_decision_gguf(folder, kind, "mlp"), mmproj(folder, "mlp")
    with served(model, projector, calibration="none") as (client, service):
        first, again, other = ask(client, [photo(1)]), ask(client, [photo(1)]), ask(client, [photo(2)])
        assert (first["x_cache"], again["x_cache"]) == ("off", "off")
        assert numbers(first) == numbers(again) != numbers(other)
        per_request = 1 if kind == "clef" else len(QUESTIONS)  # clef: one prompt for every question
        assert encodes(service) == 3 * per_request


def test_laya_refuses_images_as_llama_cpp_does(folder: Path) -> None:
    detail = refused(BUILDERS["laya"](folder / "laya.gguf"), mmproj(folder, "mlp"), "parts")
    assert [(d["loc"], d["type"]) for d in detail] == [(["body", "state"], "images_unsupported")]


def test_jev_assets_are_the_images_before_the_state_their_placeholders_dropped(folder: Path) -> None:
    """The same image as a Jev asset whose placeholder leads the state: the same prompt as llama.cpp's
    form with the bare state, so a hit on it with the same answers."""
    model, projector = vision_decision_gguf(folder, "openjev", "mlp"), mmproj(folder, "mlp")
    asset = {"type": "image", "format": "png", "data_base64": base64.b64encode(photo(5)).decode()}
    body = {"model": NAME, "state": "<photo>" + STATE, "questions": QUESTIONS, "assets": {"<photo>": asset}}
    with served(model, projector, calibration="none") as (client, _):
        by_asset = client.post("/v1/systemone", json=body).json()
        by_url = ask(client, [photo(5)])
        assert (by_asset["x_cache"], by_url["x_cache"]) == ("miss", "hit")
        assert numbers(by_asset) == numbers(by_url)
