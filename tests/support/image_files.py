"""Image files written in the tests, past the PNGs of app/platform/tiny_images.py: PNGs interlaced or
broken on purpose, JPEGs by Pillow (baseline and progressive) and patched, and stb_image (inside libmtmd, the
decoder onepass's images will meet) to decode them with."""

from __future__ import annotations

import ctypes
import io
import struct
import zlib
from pathlib import Path

import llama_cpp
from PIL import Image as PillowImage

from app.platform.tiny_images import PNG_SIGNATURE, chunk, ihdr

ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def interlaced_png(width: int, height: int) -> bytes:
    """A valid Adam7 PNG, RGB at 8 bits: each of the seven passes' rows, filter 0."""
    raw = b""
    for x0, y0, dx, dy in ADAM7:
        columns, rows = (width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy
        if columns > 0:
            raw += (b"\x00" + bytes((x * 5) % 256 for x in range(columns * 3))) * rows
    pixels = chunk(b"IDAT", zlib.compress(raw))
    return PNG_SIGNATURE + ihdr(width, height, interlace=1) + pixels + chunk(b"IEND", b"")


def bomb_png(width: int, height: int) -> bytes:
    """A PNG of a few hundred bytes that declares width x height: one IDAT of zeros, far too short."""
    return PNG_SIGNATURE + ihdr(width, height) + chunk(b"IDAT", zlib.compress(bytes(1000))) + chunk(b"IEND", b"")


def jpeg(width: int = 16, height: int = 12, progressive: bool = False, mode: str = "RGB") -> bytes:
    pixels = bytes((x * 7 + y * 3) % 256 for y in range(height) for x in range(width) for _ in range(len(mode)))
    out = io.BytesIO()
    PillowImage.frombytes(mode, (width, height), pixels).save(out, "JPEG", quality=90, progressive=progressive)
    return out.getvalue()


def jpeg_sized(data: bytes, width: int, height: int) -> bytes:
    """`data` with its frame header (SOF0/1/2) declaring width x height."""
    at = next(i for i in range(2, len(data) - 1) if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC1, 0xC2))
    return data[: at + 5] + struct.pack(">HH", height, width) + data[at + 9 :]


def jpeg_frame_type(data: bytes, marker: int) -> bytes:
    """`data` with its frame marker changed (FFC3: lossless; FFC9: arithmetic coding)."""
    at = next(i for i in range(2, len(data) - 1) if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC1, 0xC2))
    return data[: at + 1] + bytes([marker]) + data[at + 2 :]


def webp() -> bytes:
    """The start of a WebP file: RIFF, its size, WEBP, a VP8 chunk header."""
    return b"RIFF" + struct.pack("<I", 30) + b"WEBPVP8 " + struct.pack("<I", 18) + bytes(18)


def gif() -> bytes:
    out = io.BytesIO()
    PillowImage.new("RGB", (2, 2), (255, 0, 0)).save(out, "GIF")
    return out.getvalue()


def pillow_size(data: bytes) -> tuple[int, int]:
    """The size Pillow reads, after decoding every pixel (raises where Pillow cannot)."""
    image = PillowImage.open(io.BytesIO(data))
    image.load()
    return image.size


class Stb:
    """stb_image as libmtmd exports it: the decoder mtmd_helper_bitmap_init_from_buf calls first."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libmtmd.so"))
        self.load = lib.stbi_load_from_memory
        self.load.restype = ctypes.c_void_p
        self.load.argtypes = [ctypes.c_char_p, ctypes.c_int, *[ctypes.POINTER(ctypes.c_int)] * 3, ctypes.c_int]
        self.free = lib.stbi_image_free
        self.free.argtypes = [ctypes.c_void_p]

    def size(self, data: bytes) -> tuple[int, int] | None:
        """The width and height stb decodes `data` to as RGB, or None where it cannot."""
        x, y, n = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        pixels = self.load(data, len(data), ctypes.byref(x), ctypes.byref(y), ctypes.byref(n), 3)
        if not pixels:
            return None
        self.free(pixels)
        return x.value, y.value
