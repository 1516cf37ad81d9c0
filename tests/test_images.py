"""app/wire/images.py: PNG and JPEG taken, everything else refused from its bytes; and whatever it takes,
stb_image (the decoder inside libmtmd) decodes to the size it read."""

from __future__ import annotations

import contextlib
import hashlib
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.platform.tiny_images import PNG_SIGNATURE, chunk, ihdr, png, scanlines
from app.wire.images import MAX_IMAGE_BYTES, MAX_IMAGE_SIDE, Image, ImageRefused, Media, read_image
from tests.support.image_files import (
    Stb,
    bomb_png,
    gif,
    interlaced_png,
    jpeg,
    jpeg_frame_type,
    jpeg_sized,
    pillow_size,
    webp,
)


@pytest.fixture(scope="module")
def stb() -> Stb:
    return Stb()


def refused(data: bytes) -> ImageRefused:
    with pytest.raises(ImageRefused) as raised:
        read_image(data)
    return raised.value


DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}  # of each colour type
PNGS: dict[str, bytes] = {
    **{f"png colour {c} depth {d}": png(5, 3, d, c) for c, depths in DEPTHS.items() for d in depths},
    "png interlaced 13x11": interlaced_png(13, 11),
    "png interlaced 1x1": interlaced_png(1, 1),
    "png at the side bound": png(MAX_IMAGE_SIDE, 2),
}
GOOD: dict[str, bytes] = {
    **PNGS,
    "jpeg baseline": jpeg(),
    "jpeg progressive": jpeg(33, 17, progressive=True),
    "jpeg greyscale": jpeg(8, 8, mode="L"),
    "jpeg cmyk": jpeg(8, 8, mode="CMYK"),
    "jpeg at the side bound": jpeg(2, MAX_IMAGE_SIDE),
}


@pytest.mark.parametrize("name", list(GOOD))
def test_a_png_or_jpeg_is_taken_with_its_size_and_stb_decodes_it_to_that_size(stb: Stb, name: str) -> None:
    data = GOOD[name]
    image = read_image(data)
    assert image == Image(hashlib.sha256(data).hexdigest(), data, image.format, *pillow_size(data))
    assert image.format == ("png" if name.startswith("png") else "jpeg")
    assert stb.size(data) == (image.width, image.height)


# Each: the bytes, the 422 type, and the message.
HOSTILE: dict[str, tuple[bytes, str, str]] = {
    "empty": (b"", "image_format", "the image is empty"),
    "webp": (webp(), "image_format", "WebP is not taken: send PNG or JPEG"),
    "gif": (gif(), "image_format", "GIF is not taken: send PNG or JPEG"),
    "random bytes": (
        bytes(range(7, 207)),
        "image_format",
        "the bytes are not a PNG or JPEG image (they start with 07 08 09 0a 0b 0c 0d 0e)",
    ),
    "png bomb 100000 x 100000": (
        bomb_png(100_000, 100_000),
        "image_too_large",
        "the PNG is 100000 x 100000 pixels; at most 1568 a side are taken (as Jev)",
    ),
    "png one pixel past the side bound": (
        png(MAX_IMAGE_SIDE + 1, 1),
        "image_too_large",
        "the PNG is 1569 x 1 pixels; at most 1568 a side are taken (as Jev)",
    ),
    "png of 0 pixels": (bomb_png(0, 5), "image_invalid", "the PNG declares 0 x 5 pixels"),
    "png cut in its pixel data": (
        png(40, 30)[:60],
        "image_invalid",
        "the PNG is truncated: its IDAT chunk at byte 33 needs",
    ),
    "png without IEND": (png()[:-12], "image_invalid", "the PNG is truncated: it ends at byte"),
    "png with a wrong CRC": (
        png()[:-1] + b"\x00",
        "image_invalid",
        "the CRC of the PNG's IEND chunk at byte",
    ),
    "png that does not start with IHDR": (
        PNG_SIGNATURE + chunk(b"tEXt", b"a\x00b") + png()[8:],
        "image_invalid",
        "the PNG does not start with its IHDR chunk",
    ),
    "png with an impossible depth": (
        PNG_SIGNATURE + ihdr(2, 2, depth=3) + png(2, 2)[33:],
        "image_invalid",
        "the PNG's IHDR is invalid (bit depth 3, colour type 2)",
    ),
    "png whose pixel data is short": (
        PNG_SIGNATURE + ihdr(4, 4) + chunk(b"IDAT", zlib.compress(scanlines(4, 3))) + chunk(b"IEND", b""),
        "image_invalid",
        "the PNG holds 39 bytes of pixel data; its size needs 52",
    ),
    "png whose zlib stream is cut": (
        PNG_SIGNATURE + ihdr(4, 3) + chunk(b"IDAT", zlib.compress(scanlines(4, 3))[:-6]) + chunk(b"IEND", b""),
        "image_invalid",
        "the PNG's pixel data ends early: its zlib stream is cut",
    ),
    "png with an unknown filter": (
        PNG_SIGNATURE + ihdr(1, 1) + chunk(b"IDAT", zlib.compress(b"\x07abc")) + chunk(b"IEND", b""),
        "image_invalid",
        "the PNG's pixel data has an unknown filter type 7",
    ),
    "palette png without a palette": (
        PNG_SIGNATURE + ihdr(2, 2, colour=3) + chunk(b"IDAT", zlib.compress(bytes(6))) + chunk(b"IEND", b""),
        "image_invalid",
        "the PNG has no palette (PLTE)",
    ),
    "png with an unknown critical chunk": (
        png()[:33] + chunk(b"ABCD", b"") + png()[33:],
        "image_invalid",
        "the PNG has an unexpected critical chunk ABCD at byte 33",
    ),
    "jpeg bomb 8000 x 8000": (
        jpeg_sized(jpeg(), 8000, 8000),
        "image_too_large",
        "the JPEG is 8000 x 8000 pixels; at most 1568 a side are taken (as Jev)",
    ),
    "jpeg without EOI": (jpeg()[:-2], "image_invalid", "the JPEG is truncated: it ends at byte"),
    "jpeg cut in its scan": (
        jpeg(64, 64)[: jpeg(64, 64).index(b"\xff\xda") + 40],
        "image_invalid",
        "the JPEG is truncated: it ends",
    ),
    "jpeg cut in its headers": (jpeg()[:100], "image_invalid", "the JPEG is truncated: its FF"),
    "lossless jpeg": (
        jpeg_frame_type(jpeg(), 0xC3),
        "image_format",
        "a JPEG of frame type FFC3 is not taken: only baseline and progressive JPEGs are",
    ),
    "arithmetic-coded jpeg": (
        jpeg_frame_type(jpeg(), 0xC9),
        "image_format",
        "a JPEG of frame type FFC9 is not taken: only baseline and progressive JPEGs are",
    ),
    "jpeg with a frame of 0 lines": (jpeg_sized(jpeg(), 16, 0), "image_invalid", "the JPEG declares 16 x 0 pixels"),
    "over the byte bound": (
        png() + bytes(MAX_IMAGE_BYTES),
        "image_too_large",
        f"the image is {len(png()) + MAX_IMAGE_BYTES} bytes; the limit is {MAX_IMAGE_BYTES}",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_image_is_refused_with_its_type_and_message(name: str) -> None:
    data, kind, message = HOSTILE[name]
    error = refused(data)
    assert (error.kind, error.message[: len(message)]) == (kind, message), error.message


def test_what_stb_would_do_with_what_is_refused(stb: Stb) -> None:
    """Why the checks are made in Python: stb decodes a JPEG with its scan cut (grey fill) and a
    PNG bomb's header alone costs it an allocation; onepass takes neither."""
    assert stb.size(HOSTILE["jpeg cut in its scan"][0]) == (64, 64)
    assert stb.size(HOSTILE["png cut in its pixel data"][0]) is None  # libmtmd would now launch ffprobe


TRUNCATED = [
    "png colour 2 depth 8",
    "png colour 3 depth 2",
    "png interlaced 13x11",
    "jpeg baseline",
    "jpeg progressive",
]


@settings(max_examples=200, deadline=None)
@given(source=st.sampled_from(TRUNCATED), data=st.data())
def test_a_truncated_image_is_always_refused(source: str, data: st.DataObject) -> None:
    whole = GOOD[source]
    refused(whole[: data.draw(st.integers(0, len(whole) - 1))])


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    chunks, pos = [], 8
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        chunks.append((data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]))
        pos += 12 + length
    return chunks


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(source=st.sampled_from([name for name in PNGS if "bound" not in name]), data=st.data())
def test_a_png_changed_under_valid_crcs_is_refused_or_decoded_by_stb_at_its_size(
    stb: Stb, source: str, data: st.DataObject
) -> None:
    """Bytes changed inside a chunk (its header, palette or pixel data), its CRC made right again."""
    chunks = png_chunks(GOOD[source])
    at = data.draw(st.integers(0, len(chunks) - 2))  # any chunk but IEND
    body = bytearray(chunks[at][1])
    for _ in range(data.draw(st.integers(1, 3))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    chunks[at] = (chunks[at][0], bytes(body))
    changed = PNG_SIGNATURE + b"".join(chunk(kind, content) for kind, content in chunks)
    try:
        taken = read_image(changed)
    except ImageRefused:
        return
    assert stb.size(changed) == (taken.width, taken.height)


@settings(max_examples=300, deadline=None)
@given(source=st.sampled_from(list(GOOD)), data=st.data())
def test_changed_bytes_are_taken_or_refused_never_an_other_error(source: str, data: st.DataObject) -> None:
    """A JPEG whose scan data is corrupt is taken (its structure is sound); stb may then fail to
    decode it, which the engine answers as a 422 (docs/api.md)."""
    image = bytearray(GOOD[source])
    for _ in range(data.draw(st.integers(1, 4))):
        image[data.draw(st.integers(0, len(image) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(ImageRefused):
        read_image(bytes(image))


def test_media_finds_and_replaces_placeholders_in_string_values_the_longest_first() -> None:
    media = Media(placeholders=(("<img>", 0), ("<img>2", 1)))
    assert list(media.mentioned("a <img>2 b <img> c <img>2")) == [1, 0, 1]
    state = {"<img>": ["see <img>2", 3, None], "k": "<img><img>"}
    replaced = media.substitute(state, lambda i: f"[{i}]")
    assert replaced == {"<img>": ["see [1]", 3, None], "k": "[0][0]"}  # keys are left as sent
    assert Media().substitute(state, lambda i: "x") is state
