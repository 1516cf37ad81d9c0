"""Small PNG files written byte by byte (zlib and struct, so each byte is the writer's to choose): the
images the tiny vision models are asked about in the tests, the bench and docs/api.md's examples."""

from __future__ import annotations

import struct
import zlib

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def ihdr(width: int, height: int, depth: int = 8, colour: int = 2, interlace: int = 0) -> bytes:
    return chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace))


def scanlines(width: int, height: int, depth: int = 8, colour: int = 2, seed: int = 1) -> bytes:
    """Non-interlaced pixel data: each row a filter byte (cycling through the five) and varied bytes."""
    row = (width * depth * CHANNELS[colour] + 7) // 8
    rows = [bytes([y % 5]) + bytes((seed * 31 + y * 7 + x * 13) % 256 for x in range(row)) for y in range(height)]
    if colour == 3:  # palette indices within a 4-entry palette
        mask = {1: 0xFF, 2: 0xFF, 4: 0x33, 8: 0x03}[depth]
        rows = [r[:1] + bytes(b & mask for b in r[1:]) for r in rows]
    return b"".join(rows)


def stored(data: bytes) -> bytes:
    """`data` as a zlib stream of stored (uncompressed) deflate blocks: the same bytes whatever zlib
    runs, where zlib.compress's choices may differ between implementations (a page that shows an image's
    base64 must not change with the machine that made it)."""
    most = 0xFFFF  # the length field of a stored block is 16 bits
    pieces = [data[i : i + most] for i in range(0, len(data), most)] or [b""]
    blocks = b"".join(
        bytes([i == len(pieces) - 1]) + struct.pack("<HH", len(piece), 0xFFFF ^ len(piece)) + piece
        for i, piece in enumerate(pieces)
    )
    return b"\x78\x01" + blocks + struct.pack(">I", zlib.adler32(data))


def png(
    width: int = 4, height: int = 3, depth: int = 8, colour: int = 2, seed: int = 1, *, compressed: bool = True
) -> bytes:
    """A valid non-interlaced PNG (palette ones with a 4-entry PLTE). `compressed`: its pixel data
    deflated by this zlib, else `stored`, byte for byte the same on every machine."""
    palette = chunk(b"PLTE", bytes(range(12))) if colour == 3 else b""
    raw = scanlines(width, height, depth, colour, seed)
    pixels = chunk(b"IDAT", zlib.compress(raw) if compressed else stored(raw))
    return PNG_SIGNATURE + ihdr(width, height, depth, colour) + palette + pixels + chunk(b"IEND", b"")
