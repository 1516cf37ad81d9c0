"""Request bodies: Content-Encoding (zstd, gzip) within a size limit, then strict JSON."""

from __future__ import annotations

import json
import zlib
from typing import Any

from app.contract import validation_error
from app.errors import ApiError, Unprocessable

try:  # the official SDK compresses bodies with zstd when it can
    from compression.zstd import ZstdDecompressor  # type: ignore[import-not-found]
except ImportError:
    from backports.zstd import ZstdDecompressor


def too_large(limit: int, what: str = "the body") -> ApiError:
    return ApiError(413, "request_too_large", f"{what} exceeds the limit of {limit} bytes")


def decode_content(body: bytes, encoding: str, limit: int) -> bytes:
    """The body as sent before compression; a decompression bomb stops at limit + 1 bytes."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("zstd", "gzip"):
        raise ApiError(415, "unsupported_media_type", f"Content-Encoding {encoding!r} is not supported")
    try:
        if encoding == "zstd":
            decoded: bytes = ZstdDecompressor().decompress(body, max_length=limit + 1)
        else:
            decoded = zlib.decompressobj(wbits=31).decompress(body, limit + 1)
    except Exception as error:
        raise Unprocessable(
            validation_error((), f"body could not be decompressed: {error}", "value_error", None)
        ) from error
    if len(decoded) > limit:
        raise too_large(limit, "the decompressed body")
    return decoded


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(body: bytes) -> Any:
    """JSON as RFC 8259 has it: NaN and Infinity are rejected, not parsed."""
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as error:
        raise Unprocessable(
            [
                {
                    "loc": ["body", getattr(error, "pos", 0)],
                    "msg": "JSON decode error",
                    "type": "json_invalid",
                    "input": {},
                    "ctx": {"error": str(error)},
                }
            ]
        ) from error
