"""Requests with images for the tests of images over HTTP: each form a client sends an image in, and
hostile ones, each with the 422 it gets."""

from __future__ import annotations

import base64
import json
from typing import Any

from typesafe_sdk._core.multipart import Part as SdkPart
from typesafe_sdk._core.multipart import encode_multipart

from app.platform.tiny_images import png
from tests.support.image_files import bomb_png, gif, jpeg, jpeg_sized, webp

RED = png(2, 2, seed=3)

PHOTO = jpeg(8, 6)

QUESTIONS = {"q": {"type": "noul", "instructions": "Is it red?"}}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def asked(state: Any = "<a>", **fields: Any) -> dict[str, Any]:
    return {"model": "jev-latest", "state": state, "questions": QUESTIONS, **fields}


def asset(data: bytes, kind: str = "png") -> dict[str, str]:
    return {"type": "image", "format": kind, "data_base64": b64(data)}


def part_asset(name: str = "asset-0") -> dict[str, str]:
    return {"type": "image", "part": name}


def url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64,{b64(data)}"


def multipart(payload: Any, parts: dict[str, bytes]) -> tuple[str, bytes]:
    """The body typesafe-sdk sends: its own encoder, a request part then each image part."""
    encoded = [SdkPart(name, "image/png", data, name) for name, data in parts.items()]
    return encode_multipart([SdkPart("request", "application/json", json.dumps(payload).encode()), *encoded])


def problem(loc: list[Any], msg: str, kind: str, value: Any = None) -> list[dict[str, Any]]:
    return [{"loc": ["body", *loc], "msg": msg, "type": kind, "input": value}]


TOO_BIG = "pixels; at most 1568 a side are taken (as Jev)"

NINE = {f"<{i}>": asset(RED) for i in range(9)}

ONE_PLACEHOLDER = asked(assets={"<a>": part_asset()})

TRUNCATED_PNG = png(40, 30)[:60]

UNUSED = "the placeholder '<a>' is found nowhere in the state, the instructions or the criteria"

FORM = "images are data URLs: data:image/...;base64,..."


# Each: the request, its parts (None: a JSON body), and the 422's details.
HOSTILE: dict[str, tuple[Any, dict[str, bytes] | None, list[dict[str, Any]]]] = {
    "nine assets": (
        asked(" ".join(NINE), assets=NINE),
        None,
        problem(["assets", "<8>"], "9 images; a request takes at most 8", "too_long", 9),
    ),
    "nine data URLs": (
        asked("x", images=[url(RED)] * 9),
        None,
        problem(["images", 8], "9 images; a request takes at most 8", "too_long", 9),
    ),
    "webp": (
        asked(assets={"<a>": asset(webp())}),
        None,
        problem(["assets", "<a>"], "WebP is not taken: send PNG or JPEG", "image_format"),
    ),
    "gif": (
        asked(assets={"<a>": asset(gif())}),
        None,
        problem(["assets", "<a>"], "GIF is not taken: send PNG or JPEG", "image_format"),
    ),
    "random bytes": (
        asked(assets={"<a>": asset(b"\x00\x01\x02\x03 not an image")}),
        None,
        problem(
            ["assets", "<a>"],
            "the bytes are not a PNG or JPEG image (they start with 00 01 02 03 20 6e 6f 74)",
            "image_format",
        ),
    ),
    "a truncated png": (
        asked(assets={"<a>": part_asset()}),
        {"asset-0": TRUNCATED_PNG},
        problem(
            ["assets", "<a>"],
            f"the part 'asset-0': the PNG is truncated: its IDAT chunk at byte 33 needs {len(png(40, 30)) - 72} "
            "more bytes",
            "image_invalid",
        ),
    ),
    "a truncated jpeg": (
        asked(assets={"<a>": asset(PHOTO[:-2], "jpg")}),
        None,
        problem(
            ["assets", "<a>"],
            f"the JPEG is truncated: it ends at byte {len(PHOTO) - 2}, before its EOI marker",
            "image_invalid",
        ),
    ),
    "a png bomb": (
        asked(assets={"<a>": asset(bomb_png(100_000, 100_000))}),
        None,
        problem(["assets", "<a>"], f"the PNG is 100000 x 100000 {TOO_BIG}", "image_too_large"),
    ),
    "a jpeg bomb": (
        asked(assets={"<a>": asset(jpeg_sized(PHOTO, 8000, 8000), "jpeg")}),
        None,
        problem(["assets", "<a>"], f"the JPEG is 8000 x 8000 {TOO_BIG}", "image_too_large"),
    ),
    "a png of 1569 pixels": (
        asked(assets={"<a>": asset(png(1569, 1))}),
        None,
        problem(["assets", "<a>"], f"the PNG is 1569 x 1 {TOO_BIG}", "image_too_large"),
    ),
    "an asset never mentioned": (
        asked("no placeholder", assets={"<a>": asset(RED)}),
        None,
        problem(["assets", "<a>"], UNUSED, "asset_unused", "<a>"),
    ),
    "an unknown part": (
        asked(assets={"<a>": part_asset("asset-7")}),
        {"asset-0": RED},
        [
            *problem(
                ["assets", "<a>", "part"],
                "no part of the body is named 'asset-7' (its parts: asset-0)",
                "part_missing",
                "asset-7",
            ),
            *problem(["asset-0"], "no asset names the part 'asset-0'", "part_unclaimed", "asset-0"),
        ],
    ),
    "a part in a JSON body": (
        ONE_PLACEHOLDER,
        None,
        problem(
            ["assets", "<a>", "part"],
            "no part of the body is named 'asset-0' (its parts: none)",
            "part_missing",
            "asset-0",
        ),
    ),
    "a part no asset claims": (
        asked(assets={"<a>": part_asset()}),
        {"asset-0": RED, "asset-1": RED},
        problem(["asset-1"], "no asset names the part 'asset-1'", "part_unclaimed", "asset-1"),
    ),
    "a part claimed twice": (
        asked("<a> <b>", assets={"<a>": part_asset(), "<b>": part_asset()}),
        {"asset-0": RED},
        problem(
            ["assets", "<b>", "part"],
            "the part 'asset-0' is claimed by 2 assets; each part is one asset's",
            "part_reused",
            "asset-0",
        ),
    ),
    "invalid base64": (
        asked(assets={"<a>": {"type": "image", "format": "png", "data_base64": "iVBOR$$"}}),
        None,
        problem(["assets", "<a>"], "the image is not valid base64: Only base64 data is allowed", "base64_decode"),
    ),
    "base64 without a format": (
        asked(assets={"<a>": {"type": "image", "data_base64": b64(RED)}}),
        None,
        problem(["assets", "<a>", "format"], "format (png, jpg or jpeg) comes with data_base64", "missing"),
    ),
    "an asset without bytes": (
        asked(assets={"<a>": {"type": "image", "format": "png"}}),
        None,
        problem(["assets", "<a>"], "an image asset has data_base64 (with format) or part", "missing"),
    ),
    "an empty placeholder": (
        asked(assets={"": asset(RED)}),
        None,
        problem(["assets", ""], "a placeholder is a non-empty string", "string_too_short", ""),
    ),
    "an https URL": (
        asked("x", images=["https://example.com/a.png"]),
        None,
        problem(["images", 0], FORM, "data_url_invalid"),
    ),
    "an audio data URL": (
        asked("x", images=["data:audio/wav;base64,AAAA"]),
        None,
        problem(["images", 0], f"'data:audio/wav;base64': only images are taken ({FORM})", "data_url_invalid"),
    ),
    "a data URL not in base64": (
        asked("x", files=["data:image/png,abc"]),
        None,
        problem(["files", 0], f"the data URL is not base64 ({FORM})", "data_url_invalid"),
    ),
    "an image_url part that is no string": (
        asked([{"content": [{"type": "image_url", "image_url": {"url": 5}}]}]),
        None,
        problem(["state", 0, "content", 0], FORM, "data_url_invalid"),
    ),
}
