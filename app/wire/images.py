"""Image files as a request carries them: PNG or JPEG only, checked in Python from their bytes before
anything decodes them, and the `Media` a request's texts refer to them by.

libmtmd reads images with stb_image and hands whatever stb cannot decode (WebP, truncated files,
sizes past its own limits, any other bytes) to an ffprobe/ffmpeg subprocess; stb itself decodes a
file of a few hundred bytes that declares thousands of pixels a side, at hundreds of megabytes. So
every image is checked here first: its format by its signature, its declared size against the
pixel bound, then its structure through to its end (PNG: every chunk's CRC through IEND and the
pixel data's exact length; JPEG: a baseline or progressive frame and an EOI after its scans).
"""

from __future__ import annotations

import hashlib
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from app.wire.json_strings import map_strings

MAX_IMAGES = 8  # per request, as llama.cpp's /v1/systemone allows
MAX_IMAGE_SIDE = 1568  # pixels, width and height each: Jev refuses larger images
MAX_IMAGE_BYTES = 10 * 1024 * 1024  # per image file: llama.cpp's bound for an image it fetches
# The base64 text of an image at MAX_IMAGE_BYTES, and what 8 of those add to a JSON body.
MAX_BASE64_CHARS = 4 * -(-MAX_IMAGE_BYTES // 3)
IMAGES_BODY_BYTES = MAX_IMAGES * MAX_BASE64_CHARS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SIGNATURE = b"\xff\xd8\xff"
# Formats refused by name, so the message says what was sent.
OTHER_FORMATS = {
    b"GIF87a": "GIF",
    b"GIF89a": "GIF",
    b"BM": "BMP",
    b"II*\x00": "TIFF",
    b"MM\x00*": "TIFF",
    b"\x00\x00\x01\x00": "ICO",
}


@dataclass(frozen=True)
class Image:
    """One image file, checked: its SHA-256 (hex) is its identity in the cache key and the routing key."""

    sha256: str
    data: bytes = field(repr=False)
    format: Literal["png", "jpeg"]
    width: int
    height: int


class ImageRefused(ValueError):
    """An image onepass does not take: `kind` is the 422 detail's type."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


def read_image(data: bytes) -> Image:
    """The image in `data`, checked; ImageRefused says why it is not taken."""
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageRefused("image_too_large", f"the image is {len(data)} bytes; the limit is {MAX_IMAGE_BYTES}")
    if data.startswith(PNG_SIGNATURE):
        kind: Literal["png", "jpeg"] = "png"
        width, height = _png_size(data)
    elif data.startswith(JPEG_SIGNATURE):
        kind = "jpeg"
        width, height = _jpeg_size(data)
    else:
        raise ImageRefused("image_format", _not_taken(data))
    return Image(hashlib.sha256(data).hexdigest(), data, kind, width, height)


def _not_taken(data: bytes) -> str:
    if not data:
        return "the image is empty"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP is not taken: send PNG or JPEG"
    for signature, name in OTHER_FORMATS.items():
        if data.startswith(signature):
            return f"{name} is not taken: send PNG or JPEG"
    return f"the bytes are not a PNG or JPEG image (they start with {data[:8].hex(' ')})"


def _invalid(message: str) -> ImageRefused:
    return ImageRefused("image_invalid", message)


def _check_size(kind: str, width: int, height: int) -> None:
    if width < 1 or height < 1:
        raise _invalid(f"the {kind} declares {width} x {height} pixels")
    if max(width, height) > MAX_IMAGE_SIDE:
        raise ImageRefused(
            "image_too_large",
            f"the {kind} is {width} x {height} pixels; at most {MAX_IMAGE_SIDE} a side are taken (as Jev)",
        )


# PNG ----------------------------------------------------------------------------------------------

# Bit depths each colour type may have, and its channels.
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
# Adam7: each pass's first column and row, and its steps.
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def _png_chunks(data: bytes) -> Iterator[tuple[bytes, bytes, int]]:
    """Each chunk's type, data and offset, its CRC checked, through IEND."""
    pos = len(PNG_SIGNATURE)
    while True:
        if pos + 12 > len(data):
            raise _invalid(f"the PNG is truncated: it ends at byte {len(data)}, before its IEND chunk")
        length, kind = struct.unpack_from(">I4s", data, pos)
        name = kind.decode("latin-1")
        if not kind.isalpha() or not kind.isascii() or length > 0x7FFFFFFF:
            raise _invalid(f"the PNG has no valid chunk at byte {pos}")
        end = pos + 12 + length
        if end > len(data):
            raise _invalid(f"the PNG is truncated: its {name} chunk at byte {pos} needs {end - len(data)} more bytes")
        body = data[pos + 8 : pos + 8 + length]
        if zlib.crc32(kind + body) != int.from_bytes(data[end - 4 : end], "big"):
            raise _invalid(f"the CRC of the PNG's {name} chunk at byte {pos} is wrong")
        yield kind, body, pos
        if kind == b"IEND":
            return
        pos = end


def _png_size(data: bytes) -> tuple[int, int]:
    chunks = _png_chunks(data)
    kind, header, _ = next(chunks)
    if kind != b"IHDR" or len(header) != 13:
        raise _invalid("the PNG does not start with its IHDR chunk")
    width, height, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", header)
    _check_size("PNG", width, height)  # a bomb stops here, before its pixels are read
    if depth not in _PNG_DEPTHS.get(colour, ()) or compression or filtering or interlace > 1:
        raise _invalid(f"the PNG's IHDR is invalid (bit depth {depth}, colour type {colour})")
    palette, pixels = 0, []
    for kind, body, pos in chunks:
        name = kind.decode("latin-1")
        if kind == b"IDAT":
            pixels.append(body)
        elif kind == b"PLTE":
            if colour in (0, 4) or pixels or palette or not body or len(body) % 3 or len(body) > 768:
                raise _invalid(f"the PNG's PLTE chunk at byte {pos} is invalid")
            palette = len(body) // 3
        elif kind == b"tRNS":
            allowed = {0: 2, 2: 6, 3: palette}.get(colour, -1)
            if pixels or (colour == 3 and not 0 < len(body) <= allowed) or (colour != 3 and len(body) != allowed):
                raise _invalid(f"the PNG's tRNS chunk at byte {pos} is invalid")
        elif kind == b"IEND":
            if body:
                raise _invalid("the PNG's IEND chunk is not empty")
        elif kind[0] < ord("a"):  # critical (its first letter upper case): a decoder must understand it
            raise _invalid(f"the PNG has an unexpected critical chunk {name} at byte {pos}")
    if not pixels or (colour == 3 and not palette):
        raise _invalid("the PNG has no " + ("pixel data (IDAT)" if not pixels else "palette (PLTE)"))
    _check_png_pixels(b"".join(pixels), width, height, depth * _PNG_CHANNELS[colour], interlace)
    return width, height


def _png_rows(width: int, height: int, bits: int, interlace: int) -> Iterator[int]:
    """The length of each scanline (without its filter byte), pass by pass."""
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    for x0, y0, dx, dy in passes:
        columns, rows = (width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy
        if columns > 0:
            yield from ((columns * bits + 7) // 8 for _ in range(rows))


def _check_png_pixels(compressed: bytes, width: int, height: int, bits: int, interlace: int) -> None:
    """The pixel data inflates to exactly the scanlines the header declares, each with a known filter."""
    rows = list(_png_rows(width, height, bits, interlace))
    expected = len(rows) + sum(rows)
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(compressed, expected + 1)
    except zlib.error as error:
        raise _invalid(f"the PNG's pixel data does not inflate: {error}") from error
    if len(raw) > expected or inflater.unconsumed_tail:
        raise _invalid(f"the PNG holds more pixel data than its size, {expected} bytes")
    if not inflater.eof:
        raise _invalid("the PNG's pixel data ends early: its zlib stream is cut")
    if len(raw) < expected:
        raise _invalid(f"the PNG holds {len(raw)} bytes of pixel data; its size needs {expected}")
    pos = 0
    for row in rows:
        if raw[pos] > 4:
            raise _invalid(f"the PNG's pixel data has an unknown filter type {raw[pos]}")
        pos += 1 + row


# JPEG ---------------------------------------------------------------------------------------------

_JPEG_FRAMES = {0xC0, 0xC1, 0xC2}  # baseline, extended and progressive Huffman: what stb_image decodes
_JPEG_OTHER_FRAMES = {0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_SOS, _EOI = 0xDA, 0xD9


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """The frame's size, after walking the segments from SOI through EOI."""
    size: tuple[int, int] | None = None
    scans, pos = 0, 2
    while pos < len(data):
        if data[pos] != 0xFF:
            raise _invalid(f"the JPEG has no marker at byte {pos}")
        while pos < len(data) and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos == len(data):
            break
        marker, pos = data[pos], pos + 1
        if marker == _EOI:
            if size is None or not scans:
                raise _invalid("the JPEG ends before its image data")
            return size
        if 0xD0 <= marker <= 0xD8 or marker in (0x00, 0x01):
            raise _invalid(f"the JPEG has a misplaced marker FF{marker:02X} at byte {pos - 2}")
        if pos + 2 > len(data):
            break
        length = int.from_bytes(data[pos : pos + 2], "big")
        if length < 2 or pos + length > len(data):
            raise _invalid(f"the JPEG is truncated: its FF{marker:02X} segment at byte {pos - 2} runs past the end")
        body = data[pos + 2 : pos + length]
        if marker in _JPEG_OTHER_FRAMES:
            message = f"a JPEG of frame type FF{marker:02X} is not taken: only baseline and progressive JPEGs are"
            raise ImageRefused("image_format", message)
        if marker in _JPEG_FRAMES:
            if size is not None:
                raise _invalid("the JPEG has two frames")
            size = _jpeg_frame(body)
        pos += length
        if marker == _SOS:
            if size is None:
                raise _invalid("the JPEG has a scan before its frame header")
            scans, pos = scans + 1, _after_scan(data, pos)
    raise _invalid(f"the JPEG is truncated: it ends at byte {len(data)}, before its EOI marker")


def _jpeg_frame(body: bytes) -> tuple[int, int]:
    if len(body) < 6:
        raise _invalid("the JPEG's frame header is too short")
    precision, height, width, components = struct.unpack_from(">BHHB", body)
    _check_size("JPEG", width, height)
    if precision != 8 or components not in (1, 3, 4) or len(body) != 6 + 3 * components:
        raise _invalid(f"the JPEG's frame header is not taken ({precision}-bit, {components} components)")
    return width, height


def _after_scan(data: bytes, pos: int) -> int:
    """Where the marker after a scan's entropy-coded data starts (FF 00 is a stuffed byte, FF D0-D7 a restart)."""
    while (pos := data.find(b"\xff", pos)) != -1 and pos + 1 < len(data):
        following = data[pos + 1]
        if following == 0xFF:
            pos += 1
        elif following == 0x00 or 0xD0 <= following <= 0xD7:
            pos += 2
        else:
            return pos
    return len(data)


# Where a request's texts refer to its images -----------------------------------------------------


@dataclass(frozen=True)
class Media:
    """The images a request carries, in prompt order, and the placeholders its texts refer to them by.

    `placeholders`: each Jev placeholder and the index of its image (llama.cpp's forms have none).
    `fields`: the body fields the images came from, in order (`files`, `images`, `state`, `assets`).
    """

    images: tuple[Image, ...] = ()
    placeholders: tuple[tuple[str, int], ...] = ()
    fields: tuple[str, ...] = ()

    @cached_property
    def _pattern(self) -> re.Pattern[str] | None:
        # the longest first, so that a placeholder holding another one is found whole
        names = sorted((name for name, _ in self.placeholders), key=len, reverse=True)
        return re.compile("|".join(map(re.escape, names))) if names else None

    def mentioned(self, text: str) -> Iterator[int]:
        """The index of the image of each placeholder in `text`, in order."""
        if self._pattern is not None:
            index = dict(self.placeholders)
            yield from (index[found[0]] for found in self._pattern.finditer(text))

    def substitute(self, value: Any, marker: Callable[[int], str]) -> Any:
        """`value` (a text: a string, or JSON objects and arrays) with each placeholder in a string
        replaced by `marker(index of its image)`. Object keys are left as they are."""
        pattern = self._pattern
        if pattern is None:
            return value
        index = dict(self.placeholders)
        return map_strings(value, lambda text: pattern.sub(lambda found: marker(index[found[0]]), text))


NO_MEDIA = Media()
